//! Belady's OPT: evict the resident key whose next request is furthest in
//! the future. Offline: it is given the whole trace's next-use times.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{EvictCtx, EvictionPolicy, Key, KeyMap, key_map};

/// For each position `t` of `keys`, the position of the next request of
/// `keys[t]`, or `u64::MAX` when there is none.
pub fn next_use_times(keys: &[Key]) -> Vec<u64> {
    let mut next = vec![u64::MAX; keys.len()];
    let mut seen: KeyMap<Key, u64> = key_map();
    for (t, &k) in keys.iter().enumerate().rev() {
        if let Some(n) = seen.insert(k, t as u64) {
            next[t] = n;
        }
    }
    next
}

/// Belady over a known trace: `access(key, now)` must be called with `now`
/// = the position of this request in the trace given to [`Belady::new`].
#[derive(Debug)]
pub struct Belady {
    next_use: Arc<[u64]>,
    /// Resident key → its next request time.
    resident: KeyMap<Key, u64>,
    /// (next request time, key), furthest last.
    order: BTreeSet<(u64, Key)>,
}

impl Belady {
    pub fn new(next_use: Arc<[u64]>) -> Self {
        Self {
            next_use,
            resident: key_map(),
            order: BTreeSet::new(),
        }
    }

    fn next_of(&self, now: u64) -> u64 {
        self.next_use[now as usize]
    }
}

impl EvictionPolicy for Belady {
    fn name(&self) -> &'static str {
        "opt"
    }

    fn access(&mut self, key: Key, now: u64) -> bool {
        let next = self.next_of(now);
        match self.resident.get_mut(&key) {
            Some(n) => {
                self.order.remove(&(*n, key));
                *n = next;
                self.order.insert((next, key));
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, key: Key, now: u64) {
        let next = self.next_of(now);
        if let Some(old) = self.resident.insert(key, next) {
            self.order.remove(&(old, key));
        }
        self.order.insert((next, key));
    }

    fn evict(&mut self, _now: u64, ctx: &mut EvictCtx<'_>) -> Option<Key> {
        let victim = self
            .order
            .iter()
            .rev()
            .find(|(_, k)| ctx.may_evict(*k))
            .copied()?;
        self.order.remove(&victim);
        self.resident.remove(&victim.1);
        Some(victim.1)
    }

    fn remove(&mut self, key: Key) -> bool {
        match self.resident.remove(&key) {
            Some(n) => {
                self.order.remove(&(n, key));
                true
            }
            None => false,
        }
    }

    fn contains(&self, key: Key) -> bool {
        self.resident.contains_key(&key)
    }

    fn len(&self) -> usize {
        self.resident.len()
    }
}
