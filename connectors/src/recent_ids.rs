//! A bounded memory of recently read request ids: a job that runs for
//! months can notice a `req_id` read again (a producer that retried a send
//! it thought had failed, a replayed batch) without keeping every id it
//! ever read.
//!
//! Two generations of at most `window` ids each: when the current one is
//! full it becomes the previous one and the older is dropped. An id is
//! therefore remembered for at least `window` further reads (at most
//! `2 × window`), and memory never exceeds `2 × window` entries. Each id
//! keeps where it was first read, so a repeat can be reported with both
//! positions.

use std::collections::HashMap;

#[derive(Clone, Debug)]
pub struct RecentIds<P> {
    window: usize,
    current: HashMap<u64, P>,
    previous: HashMap<u64, P>,
}

impl<P: Copy> RecentIds<P> {
    /// Remembers at least the last `window` ids; 0 remembers none
    /// (`observe` never reports a repeat).
    pub fn new(window: usize) -> Self {
        Self {
            window,
            current: HashMap::new(),
            previous: HashMap::new(),
        }
    }

    /// Records `id` read at `at`. Returns where it was read before when it
    /// is still remembered (the id then keeps that first position).
    pub fn observe(&mut self, id: u64, at: P) -> Option<P> {
        if self.window == 0 {
            return None;
        }
        if let Some(&first) = self.current.get(&id) {
            return Some(first);
        }
        if let Some(first) = self.previous.remove(&id) {
            // Refreshed into the current generation: a hot repeated id
            // stays remembered however many other ids pass.
            self.insert(id, first);
            return Some(first);
        }
        self.insert(id, at);
        None
    }

    /// Where `id` was first read, if it is still remembered; unlike
    /// [`Self::observe`] this records nothing.
    pub fn get(&self, id: u64) -> Option<P> {
        self.current
            .get(&id)
            .or_else(|| self.previous.get(&id))
            .copied()
    }

    fn insert(&mut self, id: u64, at: P) {
        if self.current.len() >= self.window {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(id, at);
    }

    /// Ids held now (at most `2 × window`).
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_within_the_window_is_reported_with_the_first_position() {
        let mut ids = RecentIds::new(4);
        assert_eq!(ids.observe(7, 0), None);
        assert_eq!(ids.observe(8, 1), None);
        assert_eq!(ids.observe(7, 2), Some(0));
        // The third read still names the first.
        assert_eq!(ids.observe(7, 3), Some(0));
    }

    #[test]
    fn every_id_is_remembered_for_at_least_window_further_reads() {
        let window = 5;
        for gap in 1..=window as u64 {
            let mut ids = RecentIds::new(window);
            // Offsets so the generation switch falls anywhere.
            for filler in 0..gap * 3 {
                ids.observe(1_000 + filler, 0);
            }
            ids.observe(1, 1);
            for other in 0..gap {
                ids.observe(2_000 + other, 2);
            }
            assert_eq!(ids.observe(1, 3), Some(1), "gap {gap}");
        }
    }

    #[test]
    fn memory_is_bounded_and_old_ids_are_forgotten() {
        let mut ids = RecentIds::new(100);
        for id in 0..10_000u64 {
            assert_eq!(ids.observe(id, id), None);
            assert!(ids.len() <= 200);
        }
        // Id 0 was read 10,000 ids ago: forgotten, so a new first read.
        assert_eq!(ids.observe(0, 10_000), None);
    }

    #[test]
    fn get_looks_without_recording() {
        let mut ids = RecentIds::new(2);
        assert_eq!(ids.get(5), None);
        assert!(ids.is_empty(), "a look records nothing");
        ids.observe(5, 50);
        ids.observe(6, 60);
        ids.observe(7, 70); // 5 and 6 move to the previous generation
        assert_eq!((ids.get(5), ids.get(7)), (Some(50), Some(70)));
        ids.observe(8, 80);
        ids.observe(9, 90); // the generation holding 5 is dropped
        assert_eq!(ids.get(5), None);
    }

    #[test]
    fn window_zero_remembers_nothing() {
        let mut ids = RecentIds::new(0);
        assert_eq!(ids.observe(1, ()), None);
        assert_eq!(ids.observe(1, ()), None);
        assert!(ids.is_empty());
    }
}
