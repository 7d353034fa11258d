//! The EMB cache: one row of d_model floats per (table, row), stored in
//! pool pages lent to the EMB share (several rows per page). Rows may be
//! moved (compaction when the share shrinks); KV pages are never touched.

use super::guided::GuidedPolicy;
use crate::eviction::{Key, KeyMap, KeySet, key_map};
use crate::pool::PagePool;
use crate::predictor::AccessContext;

/// The cache key of an embedding row.
pub fn emb_key(table: u16, row: u32) -> Key {
    ((table as u64) << 32) | row as u64
}

fn split_key(k: Key) -> (u16, u32) {
    ((k >> 32) as u16, k as u32)
}

/// Lookups of one table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TableCounters {
    pub hits: u64,
    pub misses: u64,
}

/// Where a row lives: page and row index inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    page: u32,
    idx: u32,
}

#[derive(Debug)]
pub struct EmbCache {
    row_floats: usize,
    rows_per_page: usize,
    pages: Vec<u32>,
    slots: KeyMap<Key, Slot>,
    free: Vec<Slot>,
    policy: GuidedPolicy,
    counters: Vec<TableCounters>,
    /// Recently evicted rows, newest last (refill candidates).
    ghosts: Vec<Key>,
}

impl EmbCache {
    pub fn new(row_floats: usize, page_floats: usize, policy: GuidedPolicy) -> Self {
        Self {
            row_floats,
            rows_per_page: page_floats / row_floats.max(1),
            pages: Vec::new(),
            slots: key_map(),
            free: Vec::new(),
            policy,
            counters: Vec::new(),
            ghosts: Vec::new(),
        }
    }

    /// An independent copy ([`GuidedPolicy::try_clone`] says when).
    pub fn try_clone(&self) -> Option<Self> {
        Some(Self {
            row_floats: self.row_floats,
            rows_per_page: self.rows_per_page,
            pages: self.pages.clone(),
            slots: self.slots.clone(),
            free: self.free.clone(),
            policy: self.policy.try_clone()?,
            counters: self.counters.clone(),
            ghosts: self.ghosts.clone(),
        })
    }

    pub fn rows_per_page(&self) -> usize {
        self.rows_per_page
    }

    pub fn capacity_rows(&self) -> usize {
        self.pages.len() * self.rows_per_page
    }

    pub fn rows(&self) -> usize {
        self.slots.len()
    }

    /// Whether (table, row) is resident (no counting, no recency change).
    pub fn contains(&self, table: u16, row: u32) -> bool {
        self.slots.contains_key(&emb_key(table, row))
    }

    pub fn pages(&self) -> &[u32] {
        &self.pages
    }

    pub fn counters(&self) -> &[TableCounters] {
        &self.counters
    }

    fn range(&self, s: Slot) -> std::ops::Range<usize> {
        let start = s.idx as usize * self.row_floats;
        start..start + self.row_floats
    }

    /// A request of (table, row): counts a hit or miss and returns the row
    /// when resident.
    pub fn lookup<'p>(&mut self, pool: &'p PagePool, table: u16, row: u32) -> Option<&'p [f32]> {
        let key = emb_key(table, row);
        if self.counters.len() <= table as usize {
            self.counters
                .resize(table as usize + 1, TableCounters::default());
        }
        let hit = self.policy.access(key);
        if hit {
            self.counters[table as usize].hits += 1;
            self.policy.observed(key, AccessContext::default());
            let s = self.slots[&key];
            Some(&pool.page(s.page)[self.range(s)])
        } else {
            self.counters[table as usize].misses += 1;
            None
        }
    }

    /// Caches a row fetched after a miss, evicting by policy when full.
    /// Returns the evicted rows; nothing is cached when the share is empty.
    pub fn insert(
        &mut self,
        pool: &mut PagePool,
        table: u16,
        row: u32,
        values: &[f32],
    ) -> Vec<(u16, u32)> {
        let key = emb_key(table, row);
        let mut evicted = Vec::new();
        if self.slots.contains_key(&key) || self.capacity_rows() == 0 {
            return evicted;
        }
        if self.free.is_empty() {
            let Some(victim) = self.policy.evict(None) else {
                return evicted;
            };
            let s = self.slots.remove(&victim).expect("policy and slots agree");
            self.free.push(s);
            self.ghost(victim);
            evicted.push(split_key(victim));
        }
        self.place(pool, key, values);
        self.policy.insert(key);
        self.policy.observed(key, AccessContext::default());
        evicted
    }

    /// Fills a free slot without evicting (refill); false when none is free.
    pub fn refill(&mut self, pool: &mut PagePool, table: u16, row: u32, values: &[f32]) -> bool {
        let key = emb_key(table, row);
        if self.slots.contains_key(&key) || self.free.is_empty() {
            return false;
        }
        self.place(pool, key, values);
        self.policy.insert(key);
        true
    }

    fn place(&mut self, pool: &mut PagePool, key: Key, values: &[f32]) {
        let s = self.free.pop().expect("caller made room");
        pool.write_floats(s.page, self.range(s), &values[..self.row_floats]);
        self.slots.insert(key, s);
    }

    fn ghost(&mut self, key: Key) {
        self.ghosts.push(key);
        let cap = self.capacity_rows().max(1);
        if self.ghosts.len() > 2 * cap {
            self.ghosts.drain(..self.ghosts.len() - cap);
        }
    }

    /// Up to `n` recently evicted rows that are neither resident nor in
    /// `on_lane` (already being refilled), newest first.
    pub fn refill_candidates(&self, n: usize, on_lane: &KeySet<Key>) -> Vec<(u16, u32)> {
        let mut seen = crate::eviction::key_set();
        self.ghosts
            .iter()
            .rev()
            .filter(|k| !self.slots.contains_key(k) && !on_lane.contains(k) && seen.insert(**k))
            .take(n)
            .map(|&k| split_key(k))
            .collect()
    }

    /// New pages for the EMB share.
    pub fn grow(&mut self, pages: Vec<u32>) {
        for p in pages {
            for idx in (0..self.rows_per_page as u32).rev() {
                self.free.push(Slot { page: p, idx });
            }
            self.pages.push(p);
        }
        self.policy.set_capacity(self.capacity_rows());
    }

    /// Gives back `n` pages: evicts rows by policy until the rest fit, moves
    /// rows out of the pages that leave, and returns (those pages, the
    /// evicted rows as (table, row)).
    pub fn shrink(&mut self, pool: &mut PagePool, n: usize) -> (Vec<u32>, Vec<(u16, u32)>) {
        let n = n.min(self.pages.len());
        let keep_rows = (self.pages.len() - n) * self.rows_per_page;
        let mut evicted = Vec::new();
        while self.slots.len() > keep_rows {
            let victim = self.policy.evict(None).expect("resident rows exist");
            let s = self.slots.remove(&victim).expect("policy and slots agree");
            self.free.push(s);
            self.ghost(victim);
            evicted.push(split_key(victim));
        }
        let leaving: Vec<u32> = self.pages.split_off(self.pages.len() - n);
        // A set: checked for every free slot and every resident row, so a
        // linear search made a large move quadratic.
        let leaving_set: std::collections::HashSet<u32> = leaving.iter().copied().collect();
        let gone = |p: u32| leaving_set.contains(&p);
        self.free.retain(|s| !gone(s.page));
        // Compact: rows in leaving pages move to free slots of kept pages.
        let movers: Vec<(Key, Slot)> = self
            .slots
            .iter()
            .filter(|(_, s)| gone(s.page))
            .map(|(k, s)| (*k, *s))
            .collect();
        for (key, from) in movers {
            let to = self.free.pop().expect("rows fit after eviction");
            pool.copy_floats(from.page, self.range(from), to.page, self.range(to));
            self.slots.insert(key, to);
        }
        self.policy.set_capacity(self.capacity_rows());
        (leaving, evicted)
    }
}
