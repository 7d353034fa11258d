//! The key → node index of a predictive policy, four bytes per slot.
//!
//! A slot holds only the node number; the key is compared through the node,
//! which the caller loads next anyway. LARU's index also names its ghosts
//! (up to 2k + max(k + 64, 2048) keys), so a `HashMap<Key, u32>` (16-byte
//! slots) would take four times the cache room, next to a node slab that
//! on a small trace (ml-100k: 1,682 keys, 54 KiB) already outgrows L1.

use std::hash::Hasher;

use hashbrown::HashTable;

use super::recency::Recency;
use crate::eviction::Key;
use crate::eviction::hasher::KeyHasher;

#[inline(always)]
fn hash(key: Key) -> u64 {
    let mut h = KeyHasher::default();
    h.write_u64(key);
    h.finish()
}

/// Node numbers by their nodes' keys.
#[derive(Debug)]
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

    /// Indexes node `i` for `key` after a `clear`, for at most as many keys
    /// as the table held before it: the room is there, so it never rehashes
    /// (which would need the nodes, borrowed by the caller's slab pass).
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
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::collections::HashMap;

    /// Random inserts and removals, with the table growing several times,
    /// then a clear and refill, against a `HashMap`; keys collide in their
    /// low bits on purpose.
    #[test]
    fn agrees_with_a_hash_map_through_growth_and_removals() {
        let mut nodes = Recency::with_capacity(0);
        let mut index = KeyIndex::with_capacity(0);
        let mut reference: HashMap<Key, u32> = HashMap::new();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for step in 0..20_000u64 {
            let key = rng.random_range(0..3_000u64) << 40;
            match (reference.get(&key).copied(), step % 3) {
                (Some(i), 0) => {
                    index.remove(key, i);
                    reference.remove(&key);
                    nodes.release(i);
                }
                (Some(i), _) => assert_eq!(index.get(key, &nodes), Some(i)),
                (None, _) => {
                    assert_eq!(index.get(key, &nodes), None, "step {step}");
                    let i = nodes.alloc(key, 0);
                    index.insert(key, i, &nodes);
                    reference.insert(key, i);
                }
            }
            assert_eq!(index.len(), reference.len());
        }
        for (&key, &i) in &reference {
            assert_eq!(index.get(key, &nodes), Some(i));
        }
        // Emptied and refilled with every other key, as a ghost collection does.
        index.clear();
        let kept: Vec<(Key, u32)> = reference.iter().map(|(&k, &i)| (k, i)).step_by(2).collect();
        for &(key, i) in &kept {
            index.insert_fresh(key, i);
        }
        assert_eq!(index.len(), kept.len());
        for (&key, &i) in &reference {
            let expected = kept.contains(&(key, i)).then_some(i);
            assert_eq!(
                index.get(key, &nodes),
                expected,
                "key {key} after the refill"
            );
        }
        let i = nodes.alloc(u64::MAX, 0);
        index.insert(u64::MAX, i, &nodes);
        assert_eq!(index.get(u64::MAX, &nodes), Some(i));
    }
}
