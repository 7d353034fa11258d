//! The item-prefix KV cache (BAT Item-as-prefix): one entry per item id,
//! holding that item's few KV blocks; entries in use are pinned. Entries are
//! keyed by the item id itself (widened, never hashed to a shorter key), so
//! one item can never be served another item's KV.

use super::guided::GuidedPolicy;
use crate::eviction::{Key, KeyMap, key_map};
use crate::pool::PagePool;
use crate::predictor::AccessContext;

#[derive(Clone, Debug)]
struct Entry {
    pages: Vec<u32>,
    pins: u32,
}

#[derive(Debug)]
pub struct ItemKvCache {
    entries: KeyMap<Key, Entry>,
    policy: GuidedPolicy,
    hits: u64,
    misses: u64,
    pages: usize,
    /// Pages of pinned entries (in use), which no eviction can free.
    pinned_pages: usize,
    /// Pages of the KV share, and the capacity in entries last given to
    /// the policy (LARU's k counts keys, not pages).
    kv_pages: usize,
    capacity: usize,
}

impl ItemKvCache {
    pub fn new(policy: GuidedPolicy) -> Self {
        Self {
            entries: key_map(),
            policy,
            hits: 0,
            misses: 0,
            pages: 0,
            pinned_pages: 0,
            kv_pages: 0,
            capacity: 0,
        }
    }

    /// An independent copy ([`GuidedPolicy::try_clone`] says when).
    pub fn try_clone(&self) -> Option<Self> {
        Some(Self {
            entries: self.entries.clone(),
            policy: self.policy.try_clone()?,
            hits: self.hits,
            misses: self.misses,
            pages: self.pages,
            pinned_pages: self.pinned_pages,
            kv_pages: self.kv_pages,
            capacity: self.capacity,
        })
    }

    /// Pages held by all entries.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Pages that evictions could free now (those of unpinned entries).
    pub fn evictable_pages(&self) -> usize {
        debug_assert_eq!(
            self.pinned_pages,
            self.entries
                .values()
                .filter(|e| e.pins > 0)
                .map(|e| e.pages.len())
                .sum::<usize>()
        );
        self.pages - self.pinned_pages
    }

    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// (hits, misses) of `get`.
    pub fn counts(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// The KV share is `kv_pages` pages: the policy's capacity becomes the
    /// entries that many pages hold.
    pub fn set_capacity_pages(&mut self, kv_pages: usize) {
        self.kv_pages = kv_pages;
        self.refresh_capacity();
    }

    /// The capacity in entries given to the policy.
    pub fn capacity_entries(&self) -> usize {
        self.capacity
    }

    /// Entries vary in size (an item's tokens fill one or more blocks), so
    /// the capacity is estimated as `kv_pages` ÷ the mean pages of the
    /// entries cached now (rounded down: a k above what the cache can hold
    /// costs LARU its consistency with good predictions), and one page per
    /// entry, the least an item takes, while none is cached. The share is
    /// also the user-prefix cache's, so it is the most the cache can hold.
    fn refresh_capacity(&mut self) {
        let k = if self.entries.is_empty() {
            self.kv_pages
        } else {
            self.kv_pages * self.entries.len() / self.pages.max(1)
        }
        .max(1);
        if k != self.capacity {
            self.capacity = k;
            self.policy.set_capacity(k);
        }
    }

    /// The item's blocks when cached, pinned until `unpin`; counts hit/miss.
    pub fn get(&mut self, item: u32) -> Option<Vec<u32>> {
        let key = item as Key;
        if self.policy.access(key) {
            self.hits += 1;
            self.policy.observed(key, AccessContext::default());
            let e = self.entries.get_mut(&key).expect("policy tracks entries");
            if e.pins == 0 {
                self.pinned_pages += e.pages.len();
            }
            e.pins += 1;
            Some(e.pages.clone())
        } else {
            self.misses += 1;
            None
        }
    }

    /// Caches `pages` (already written) for `item`, pinned once. When the
    /// item is cached already, the older copy stays (pinned once more) and
    /// `pages` go back to the pool instead of leaking under a lost entry.
    pub fn insert(&mut self, pool: &mut PagePool, item: u32, pages: Vec<u32>) {
        let key = item as Key;
        if let Some(e) = self.entries.get_mut(&key) {
            if e.pins == 0 {
                self.pinned_pages += e.pages.len();
            }
            e.pins += 1;
            for p in pages {
                super::prefix::free_page(pool, p);
            }
            return;
        }
        self.pages += pages.len();
        self.pinned_pages += pages.len();
        self.entries.insert(key, Entry { pages, pins: 1 });
        self.policy.insert(key);
        self.policy.observed(key, AccessContext::default());
        self.refresh_capacity();
    }

    pub fn unpin(&mut self, item: u32) {
        if let Some(e) = self.entries.get_mut(&(item as Key))
            && e.pins > 0
        {
            e.pins -= 1;
            if e.pins == 0 {
                self.pinned_pages -= e.pages.len();
            }
        }
    }

    /// Evicts one unpinned entry by policy, freeing its pages.
    pub fn evict_one(&mut self, pool: &mut PagePool) -> bool {
        let entries = &self.entries;
        let evictable = |k: Key| entries.get(&k).is_some_and(|e| e.pins == 0);
        let Some(k) = self.policy.evict(Some(&evictable)) else {
            return false;
        };
        let e = self.entries.remove(&k).expect("policy tracks entries");
        self.pages -= e.pages.len();
        for p in e.pages {
            super::prefix::free_page(pool, p);
        }
        self.refresh_capacity();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_insert_keeps_the_first_copy_and_frees_its_pages() {
        let mut pool = PagePool::new(4, 2);
        let mut c = ItemKvCache::new(GuidedPolicy::new("lru", 4).unwrap());
        let first = vec![pool.alloc_kv().unwrap(), pool.alloc_kv().unwrap()];
        c.insert(&mut pool, 9, first.clone());
        let again = vec![pool.alloc_kv().unwrap(), pool.alloc_kv().unwrap()];
        c.insert(&mut pool, 9, again);
        assert_eq!((c.entries(), c.pages(), pool.free_pages()), (1, 2, 2));
        assert_eq!(c.get(9), Some(first));
        // Pinned by two inserts and one get: evictable after three unpins.
        for _ in 0..3 {
            assert!(!c.evict_one(&mut pool));
            c.unpin(9);
        }
        assert!(c.evict_one(&mut pool));
        assert_eq!((pool.free_pages(), pool.rejected_frees()), (4, 0));
    }

    /// LARU's k is the entries the cache holds, not its pages: 8 pages of
    /// 2-page entries hold 4, and with perfect predictions LARU then hits
    /// as often as OPT of 4 entries (given k = 8 it falls back to LRU
    /// when no prediction was wrong, and misses more).
    #[test]
    fn laru_gets_its_capacity_in_entries_and_matches_opt() {
        use crate::eviction::next_use_times;
        use crate::eviction::{Belady, EvictCtx, EvictionPolicy, Mode, PredictiveLru};
        let keys: Vec<u64> = (0..2000u64).map(|t| (t * 7 + t / 13) % 9).collect();
        let next = next_use_times(&keys);
        let mut opt = Belady::new(next.clone().into());
        let mut opt_hits = 0;
        for (t, &key) in keys.iter().enumerate() {
            if opt.access(key, t as u64) {
                opt_hits += 1;
            } else {
                if opt.len() >= 4 {
                    opt.evict(t as u64, &mut EvictCtx::default());
                }
                opt.insert(key, t as u64);
            }
        }
        let laru = PredictiveLru::new(Mode::LaruAsync, 8);
        let mut c = ItemKvCache::new(GuidedPolicy::without_predictor(Box::new(laru)));
        c.set_capacity_pages(8);
        let mut pool = PagePool::new(8, 2);
        for (t, &key) in keys.iter().enumerate() {
            let item = key as u32;
            if c.get(item).is_none() {
                while pool.free_pages() < 2 {
                    assert!(c.evict_one(&mut pool));
                }
                let pages = vec![pool.alloc_kv().unwrap(), pool.alloc_kv().unwrap()];
                c.insert(&mut pool, item, pages);
            }
            c.unpin(item);
            let n = next[t];
            c.policy
                .set_prediction(key, if n == u64::MAX { f64::MAX } else { n as f64 });
        }
        assert_eq!(c.capacity_entries(), 4);
        assert_eq!(c.counts().0, opt_hits);
    }
}
