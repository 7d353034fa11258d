//! Per-user state bounded by capacity: a map keyed by user id that evicts
//! its least recently used entry when full, so a job that runs for months
//! holds at most `capacity` users however many it has seen.
//!
//! Recency is a counter bumped on every use, not a clock, so eviction is
//! deterministic: the same sequence of calls evicts the same users.

use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Debug)]
pub struct LruMap<V> {
    capacity: usize,
    /// Value and the stamp of its last use.
    entries: HashMap<u64, (V, u64)>,
    /// Stamp of last use → key; the first entry is the least recently used.
    order: BTreeMap<u64, u64>,
    next_stamp: u64,
    evictions: u64,
    peak: usize,
}

impl<V> LruMap<V> {
    /// A map of at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_stamp: 0,
            evictions: 0,
            peak: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries evicted for capacity so far (removals and `retain` do not count).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The most entries ever held at once.
    pub fn peak_len(&self) -> usize {
        self.peak
    }

    pub fn contains_key(&self, key: u64) -> bool {
        self.entries.contains_key(&key)
    }

    /// Reads an entry without counting it as a use.
    pub fn get(&self, key: u64) -> Option<&V> {
        self.entries.get(&key).map(|(v, _)| v)
    }

    /// Inserts or replaces `key`'s value and marks it most recently used;
    /// returns the entry evicted to make room, if any.
    pub fn insert(&mut self, key: u64, value: V) -> Option<(u64, V)> {
        let stamp = self.bump();
        if let Some(slot) = self.entries.get_mut(&key) {
            self.order.remove(&slot.1);
            *slot = (value, stamp);
            self.order.insert(stamp, key);
            return None;
        }
        let evicted = self.make_room();
        self.entries.insert(key, (value, stamp));
        self.order.insert(stamp, key);
        self.peak = self.peak.max(self.entries.len());
        evicted
    }

    /// The value of `key`, inserted with `make` if absent, marked most
    /// recently used. May evict the least recently used other entry.
    pub fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> V) -> &mut V {
        let stamp = self.bump();
        if let Some(old) = self.entries.get(&key).map(|(_, s)| *s) {
            self.order.remove(&old);
        } else {
            self.make_room();
            self.entries.insert(key, (make(), stamp));
            self.peak = self.peak.max(self.entries.len());
        }
        self.order.insert(stamp, key);
        let slot = self.entries.get_mut(&key).expect("present");
        slot.1 = stamp;
        &mut slot.0
    }

    pub fn remove(&mut self, key: u64) -> Option<V> {
        let (value, stamp) = self.entries.remove(&key)?;
        self.order.remove(&stamp);
        Some(value)
    }

    /// Keeps the entries for which `keep` returns true (not counted as evictions).
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &mut V) -> bool) {
        let order = &mut self.order;
        self.entries.retain(|&key, (value, stamp)| {
            let kept = keep(key, value);
            if !kept {
                order.remove(stamp);
            }
            kept
        });
    }

    fn bump(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    fn make_room(&mut self) -> Option<(u64, V)> {
        if self.entries.len() < self.capacity {
            return None;
        }
        let (_, key) = self.order.pop_first()?;
        let (value, _) = self.entries.remove(&key).expect("order and entries agree");
        self.evictions += 1;
        Some((key, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used_and_counts_it() {
        let mut m = LruMap::new(2);
        assert_eq!(m.insert(1, 'a'), None);
        assert_eq!(m.insert(2, 'b'), None);
        // Using 1 makes 2 the least recently used.
        *m.get_or_insert_with(1, || 'x') = 'A';
        assert_eq!(m.insert(3, 'c'), Some((2, 'b')));
        assert_eq!(m.get(1), Some(&'A'));
        assert!(!m.contains_key(2));
        assert_eq!(m.len(), 2);
        assert_eq!(m.evictions(), 1);
        assert_eq!(m.peak_len(), 2);
        // Replacing a present key evicts nothing.
        assert_eq!(m.insert(3, 'C'), None);
        assert_eq!(m.evictions(), 1);
    }

    #[test]
    fn get_does_not_count_as_a_use() {
        let mut m = LruMap::new(2);
        m.insert(1, 0);
        m.insert(2, 0);
        assert_eq!(m.get(1), Some(&0));
        m.insert(3, 0);
        assert!(!m.contains_key(1), "a read does not protect from eviction");
    }

    #[test]
    fn never_exceeds_capacity_and_retain_and_remove_keep_order_consistent() {
        let mut m = LruMap::new(100);
        for k in 0..10_000u64 {
            *m.get_or_insert_with(k % 337, || 0u32) += 1;
            m.insert(k * 7 % 1_009, 1);
            assert!(m.len() <= 100);
            if k % 500 == 0 {
                m.retain(|key, _| key % 3 != 0);
                m.remove(k % 1_009);
            }
        }
        assert_eq!(m.peak_len(), 100);
        assert!(m.evictions() > 0);
        assert_eq!(m.order.len(), m.entries.len());
        for (&stamp, key) in &m.order {
            assert_eq!(m.entries[key].1, stamp);
        }
    }
}
