//! The key → node index of a predictive policy, four bytes per slot.
//!
//! A slot holds only the node number; the key is compared through the node,
//! which the caller loads next anyway. LARU's index also names its ghosts
//! (up to about three times the cache), so a `HashMap<Key, u32>` (16-byte
//! slots) would spill the index and the node slab out of the L1 cache.

use std::hash::Hasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use super::recency::Recency;
use crate::eviction::Key;
use crate::eviction::hasher::KeyHasher;

#[inline(always)]
fn hash(key: Key) -> u64 {
    let mut h = KeyHasher::default();
    h.write_u64(key);
    h.finish()
}

/// Where a key stands in the index.
#[derive(Debug)]
pub(super) enum Slot<'a> {
    Known(u32),
    /// Not known: `insert` gives it a node (one probe for both).
    Unknown(hashbrown::hash_table::VacantEntry<'a, u32>),
}

/// Node numbers by their nodes' keys.
#[derive(Debug, Default)]
pub(super) struct KeyIndex {
    table: HashTable<u32>,
}

impl KeyIndex {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            table: HashTable::with_capacity(capacity),
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.len()
    }

    #[inline(always)]
    pub fn get(&self, key: Key, nodes: &Recency) -> Option<u32> {
        self.table
            .find(hash(key), |&i| nodes.node(i).key == key)
            .copied()
    }

    /// The key's node, or its free slot.
    #[inline(always)]
    pub fn slot(&mut self, key: Key, nodes: &Recency) -> Slot<'_> {
        match self.table.entry(
            hash(key),
            |&i| nodes.node(i).key == key,
            |&i| hash(nodes.node(i).key),
        ) {
            Entry::Occupied(e) => Slot::Known(*e.get()),
            Entry::Vacant(v) => Slot::Unknown(v),
        }
    }

    /// Indexes node `i`, which holds `key`, known to be absent.
    #[inline(always)]
    pub fn insert(&mut self, key: Key, i: u32, nodes: &Recency) {
        self.table
            .insert_unique(hash(key), i, |&j| hash(nodes.node(j).key));
    }

    /// Forgets every key, keeping the table's room.
    pub fn clear(&mut self) {
        self.table.clear();
    }

    /// Indexes node `i` for `key` while the table has room for it (the
    /// keys it held before a `clear`); grows only if it has not.
    #[inline(always)]
    pub fn insert_fresh(&mut self, key: Key, i: u32) {
        self.table
            .insert_unique(hash(key), i, |_| unreachable!("the table kept its room"));
    }

    /// Forgets node `i`, which holds `key`.
    #[inline(always)]
    pub fn remove(&mut self, key: Key, i: u32) {
        if let Ok(e) = self.table.find_entry(hash(key), |&j| j == i) {
            e.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random inserts and removals, with the table growing several times,
    /// against a `HashMap`; keys collide in their low bits on purpose.
    #[test]
    fn agrees_with_a_hash_map_through_growth_and_removals() {
        let mut nodes = Recency::with_capacity(0);
        let mut index = KeyIndex::with_capacity(0);
        let mut reference: HashMap<Key, u32> = HashMap::new();
        let mut x = 1u64;
        for step in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % 3_000) << 40;
            match (reference.get(&key).copied(), step % 3) {
                (Some(i), 0) => {
                    index.remove(key, i);
                    reference.remove(&key);
                    nodes.release(i);
                }
                (Some(i), _) => assert_eq!(index.get(key, &nodes), Some(i)),
                (None, _) => {
                    assert_eq!(index.get(key, &nodes), None, "step {step}");
                    match index.slot(key, &nodes) {
                        Slot::Unknown(v) => {
                            let i = nodes.alloc(key, 0);
                            v.insert(i);
                            reference.insert(key, i);
                        }
                        Slot::Known(i) => panic!("{key} known as {i} at step {step}"),
                    }
                }
            }
            assert_eq!(index.len(), reference.len());
        }
        for (&key, &i) in &reference {
            assert!(matches!(index.slot(key, &nodes), Slot::Known(j) if j == i));
        }
        let i = nodes.alloc(u64::MAX, 0);
        index.insert(u64::MAX, i, &nodes);
        assert_eq!(index.get(u64::MAX, &nodes), Some(i));
    }
}
