//! A node's device memory: one pool of fixed pages (one page = one KV
//! block) split by α between the EMB cache and the user-prefix KV cache.
//!
//! - EMB rows live in pool pages (several rows per page), keyed by
//!   (table, row), evicted least-recently-used.
//! - Prefix KV blocks are indexed by a chained hash of block contents
//!   (parent hash, item ids of the block), like SGLang's radix cache: equal
//!   history prefixes share blocks, only leaves are evicted, and blocks in use
//!   by the current request are pinned. KV pages never move.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use grflow_kernels::KvBlockStore;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Pool size in bytes.
    pub pool_bytes: u64,
    /// EMB share α of the pool.
    pub alpha: f64,
    pub emb_policy: String,
    pub kv_policy: String,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            pool_bytes: 48 << 20,
            alpha: 0.5,
            emb_policy: "lru".into(),
            kv_policy: "lru".into(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MemoryError {
    #[error("memory.alpha must be in [0, 1] (got {0})")]
    Alpha(f64),
    #[error("memory.{field}: policy {name:?} is not available here (available: lru)")]
    Policy { field: &'static str, name: String },
    #[error("memory.pool_bytes {pool_bytes} holds no page of {page_bytes} bytes")]
    TooSmall { pool_bytes: u64, page_bytes: u64 },
    #[error(
        "KV share exhausted: {wanted} blocks wanted, {free} free after evicting every unpinned leaf"
    )]
    KvFull { wanted: usize, free: usize },
}

/// The longest cached prefix of a token sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefixMatch {
    /// Tokens covered by `blocks` (a multiple of the block size).
    pub matched_tokens: usize,
    pub blocks: Vec<u32>,
    hashes: Vec<u64>,
}

/// Occupancy figures for telemetry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryStats {
    pub pages: usize,
    pub emb_pages: usize,
    pub kv_pages: usize,
    pub emb_rows: usize,
    pub emb_capacity_rows: usize,
    pub kv_blocks_cached: usize,
    pub kv_blocks_free: usize,
}

/// Pool pages as a KV block store: block id = page id.
#[derive(Debug)]
pub struct PoolArena {
    page_floats: usize,
    data: Vec<f32>,
}

impl KvBlockStore for PoolArena {
    fn block_floats(&self) -> usize {
        self.page_floats
    }
    fn block(&self, id: u32) -> &[f32] {
        let s = id as usize * self.page_floats;
        &self.data[s..s + self.page_floats]
    }
    fn block_mut(&mut self, id: u32) -> &mut [f32] {
        let s = id as usize * self.page_floats;
        &mut self.data[s..s + self.page_floats]
    }
}

#[derive(Debug)]
struct CachedBlock {
    page: u32,
    parent: Option<u64>,
    children: u32,
    last_use: u64,
    pins: u32,
}

#[derive(Debug)]
pub struct NodeMemory {
    cfg: MemoryConfig,
    d_model: usize,
    block_tokens: usize,
    arena: PoolArena,
    emb_pages: usize,
    // EMB cache: slot → (table,row); LRU order by tick.
    emb_slots: HashMap<(u16, u32), (u32, u64)>,
    emb_lru: BTreeMap<u64, (u16, u32)>,
    emb_free_slots: Vec<u32>,
    // KV prefix cache.
    kv_free: Vec<u32>,
    kv_blocks: HashMap<u64, CachedBlock>,
    /// Evictable leaves (no children, not pinned) by last use.
    kv_leaves: BTreeMap<(u64, u64), ()>,
    tick: u64,
}

impl NodeMemory {
    /// `page_floats` = one KV block of the model; `d_model` = one EMB row.
    pub fn new(
        cfg: MemoryConfig,
        page_floats: usize,
        d_model: usize,
        block_tokens: usize,
    ) -> Result<Self, MemoryError> {
        if !(0.0..=1.0).contains(&cfg.alpha) {
            return Err(MemoryError::Alpha(cfg.alpha));
        }
        for (field, name) in [
            ("emb_policy", &cfg.emb_policy),
            ("kv_policy", &cfg.kv_policy),
        ] {
            if name != "lru" {
                return Err(MemoryError::Policy {
                    field,
                    name: name.clone(),
                });
            }
        }
        let page_bytes = (page_floats * 4) as u64;
        let pages = (cfg.pool_bytes / page_bytes.max(1)) as usize;
        if pages == 0 {
            return Err(MemoryError::TooSmall {
                pool_bytes: cfg.pool_bytes,
                page_bytes,
            });
        }
        let emb_pages = ((pages as f64) * cfg.alpha).round() as usize;
        let rows_per_page = page_floats / d_model.max(1);
        let emb_rows = emb_pages * rows_per_page;
        Ok(Self {
            d_model,
            block_tokens,
            arena: PoolArena {
                page_floats,
                data: vec![0.0; pages * page_floats],
            },
            emb_pages,
            emb_slots: HashMap::new(),
            emb_lru: BTreeMap::new(),
            emb_free_slots: (0..emb_rows as u32).rev().collect(),
            kv_free: (emb_pages as u32..pages as u32).rev().collect(),
            kv_blocks: HashMap::new(),
            kv_leaves: BTreeMap::new(),
            tick: 0,
            cfg,
        })
    }

    pub fn alpha(&self) -> f64 {
        self.cfg.alpha
    }

    pub fn stats(&self) -> MemoryStats {
        let pages = self.arena.data.len() / self.arena.page_floats;
        MemoryStats {
            pages,
            emb_pages: self.emb_pages,
            kv_pages: pages - self.emb_pages,
            emb_rows: self.emb_slots.len(),
            emb_capacity_rows: self.emb_slots.len() + self.emb_free_slots.len(),
            kv_blocks_cached: self.kv_blocks.len(),
            kv_blocks_free: self.kv_free.len(),
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn slot_range(&self, slot: u32) -> std::ops::Range<usize> {
        let s = slot as usize * self.d_model;
        s..s + self.d_model
    }

    /// The cached row, counting it as used; `None` on a miss.
    pub fn emb_get(&mut self, table: u16, row: u32) -> Option<&[f32]> {
        let tick = self.next_tick();
        let (slot, last) = self.emb_slots.get_mut(&(table, row))?;
        self.emb_lru.remove(last);
        *last = tick;
        let slot = *slot;
        self.emb_lru.insert(tick, (table, row));
        let range = self.slot_range(slot);
        Some(&self.arena.data[range])
    }

    /// Caches a fetched row, evicting the least-recently-used row when full.
    /// Returns residency changes as (table, row, +1 | -1).
    pub fn emb_insert(&mut self, table: u16, row: u32, values: &[f32]) -> Vec<(u16, u32, i32)> {
        let mut changes = Vec::new();
        if self.emb_slots.contains_key(&(table, row)) {
            return changes;
        }
        let slot = match self.emb_free_slots.pop() {
            Some(s) => s,
            None => {
                let Some((_, victim)) = self.emb_lru.pop_first() else {
                    return changes; // α = 0: no EMB share at all
                };
                let (slot, _) = self.emb_slots.remove(&victim).expect("lru and slots agree");
                changes.push((victim.0, victim.1, -1));
                slot
            }
        };
        let range = self.slot_range(slot);
        self.arena.data[range].copy_from_slice(values);
        let tick = self.next_tick();
        self.emb_slots.insert((table, row), (slot, tick));
        self.emb_lru.insert(tick, (table, row));
        changes.push((table, row, 1));
        changes
    }

    fn block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
        // FNV-1a over the parent hash and the block's item ids: stable across runs.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |x: u64| {
            for b in x.to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        eat(parent.unwrap_or(0x9e37_79b9_7f4a_7c15));
        for &t in tokens {
            eat(t as u64);
        }
        h
    }

    /// Longest cached prefix of `tokens` (whole blocks), pinned until
    /// `kv_commit_prefix`.
    pub fn kv_match_prefix(&mut self, tokens: &[u32]) -> PrefixMatch {
        let tick = self.next_tick();
        let mut m = PrefixMatch::default();
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.block_tokens) {
            let h = Self::block_hash(parent, chunk);
            let Some(b) = self.kv_blocks.get_mut(&h) else {
                break;
            };
            if b.children == 0 && b.pins == 0 {
                self.kv_leaves.remove(&(b.last_use, h));
            }
            b.pins += 1;
            b.last_use = tick;
            m.blocks.push(b.page);
            m.hashes.push(h);
            m.matched_tokens += self.block_tokens;
            parent = Some(h);
        }
        m
    }

    /// Cached prefix length of `tokens` without touching recency or pins.
    pub fn kv_cached_prefix_len(&self, tokens: &[u32]) -> usize {
        let mut parent = None;
        let mut len = 0;
        for chunk in tokens.chunks_exact(self.block_tokens) {
            let h = Self::block_hash(parent, chunk);
            if !self.kv_blocks.contains_key(&h) {
                break;
            }
            len += self.block_tokens;
            parent = Some(h);
        }
        len
    }

    /// Free KV pages for a request, evicting least-recently-used unpinned
    /// leaves when needed.
    pub fn kv_alloc(&mut self, n: usize) -> Result<Vec<u32>, MemoryError> {
        while self.kv_free.len() < n {
            let Some(((_, h), ())) = self.kv_leaves.pop_first() else {
                return Err(MemoryError::KvFull {
                    wanted: n,
                    free: self.kv_free.len(),
                });
            };
            let b = self.kv_blocks.remove(&h).expect("leaf is cached");
            self.kv_free.push(b.page);
            if let Some(p) = b.parent {
                let parent = self
                    .kv_blocks
                    .get_mut(&p)
                    .expect("parent outlives children");
                parent.children -= 1;
                if parent.children == 0 && parent.pins == 0 {
                    self.kv_leaves.insert((parent.last_use, p), ());
                }
            }
        }
        let at = self.kv_free.len() - n;
        Ok(self.kv_free.split_off(at))
    }

    /// After a forward: the full blocks of `tokens` beyond the match join the
    /// cache (their pages are `block_table[matched..]`), the partial tail page
    /// returns to the free list, and the matched blocks are unpinned.
    pub fn kv_commit_prefix(&mut self, tokens: &[u32], block_table: &[u32], matched: &PrefixMatch) {
        let tick = self.next_tick();
        let full = tokens.len() / self.block_tokens;
        let mut parent = matched.hashes.last().copied();
        for (i, &page) in block_table.iter().enumerate().skip(matched.blocks.len()) {
            if i >= full {
                self.kv_free.push(page);
                continue;
            }
            let chunk = &tokens[i * self.block_tokens..(i + 1) * self.block_tokens];
            let h = Self::block_hash(parent, chunk);
            if let Some(p) = parent {
                let pb = self.kv_blocks.get_mut(&p).expect("parent cached");
                if pb.children == 0 && pb.pins == 0 {
                    self.kv_leaves.remove(&(pb.last_use, p));
                }
                pb.children += 1;
            }
            self.kv_blocks.insert(
                h,
                CachedBlock {
                    page,
                    parent,
                    children: 0,
                    last_use: tick,
                    pins: 0,
                },
            );
            parent = Some(h);
        }
        // Unpin the matched path; blocks that end up childless become leaves.
        let last_new = parent.filter(|h| !matched.hashes.contains(h));
        for &h in &matched.hashes {
            let b = self
                .kv_blocks
                .get_mut(&h)
                .expect("pinned blocks stay cached");
            b.pins -= 1;
            if b.children == 0 && b.pins == 0 {
                self.kv_leaves.insert((b.last_use, h), ());
            }
        }
        if let Some(h) = last_new {
            let b = &self.kv_blocks[&h];
            self.kv_leaves.insert((b.last_use, h), ());
        }
    }

    /// The pool as KV block storage for the model.
    pub fn kv_store(&mut self) -> &mut PoolArena {
        &mut self.arena
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 4 floats per page, 2 floats per row → 2 rows per page; block of 2 tokens.
    fn mem(pages: u64, alpha: f64) -> NodeMemory {
        let cfg = MemoryConfig {
            pool_bytes: pages * 16,
            alpha,
            ..Default::default()
        };
        NodeMemory::new(cfg, 4, 2, 2).unwrap()
    }

    #[test]
    fn emb_rows_hit_after_insert_and_evict_lru() {
        let mut m = mem(4, 0.5); // 2 EMB pages = 4 rows
        for r in 0..4 {
            assert!(m.emb_get(0, r).is_none());
            m.emb_insert(0, r, &[r as f32, 1.0]);
        }
        assert_eq!(m.emb_get(0, 2), Some(&[2.0, 1.0][..]));
        m.emb_get(0, 0);
        // Row 1 is now least recently used.
        let changes = m.emb_insert(0, 9, &[9.0, 9.0]);
        assert_eq!(changes, vec![(0, 1, -1), (0, 9, 1)]);
        assert!(m.emb_get(0, 1).is_none());
        assert_eq!(m.emb_get(0, 9), Some(&[9.0, 9.0][..]));
    }

    #[test]
    fn prefix_is_reused_and_extended() {
        let mut m = mem(8, 0.0);
        let hist = [1, 2, 3, 4, 5];
        let p = m.kv_match_prefix(&hist);
        assert_eq!(p.matched_tokens, 0);
        let table = m.kv_alloc(3).unwrap();
        m.kv_commit_prefix(&hist, &table, &p);
        assert_eq!(
            m.kv_cached_prefix_len(&hist),
            4,
            "two full blocks cached, tail is scratch"
        );
        assert_eq!(m.stats().kv_blocks_free, 6);

        let longer = [1, 2, 3, 4, 5, 6, 7];
        let p = m.kv_match_prefix(&longer);
        assert_eq!(p.matched_tokens, 4);
        assert_eq!(
            p.blocks,
            table[..2].to_vec(),
            "same pages: KV blocks never move"
        );
        let mut t2 = p.blocks.clone();
        t2.extend(m.kv_alloc(2).unwrap());
        m.kv_commit_prefix(&longer, &t2, &p);
        assert_eq!(m.kv_cached_prefix_len(&longer), 6);
        // A different history shares nothing.
        assert_eq!(m.kv_cached_prefix_len(&[9, 9, 3, 4]), 0);
    }

    #[test]
    fn only_unpinned_leaves_are_evicted() {
        let mut m = mem(3, 0.0);
        let a = [1, 2, 3, 4];
        let p = m.kv_match_prefix(&a);
        let t = m.kv_alloc(2).unwrap();
        m.kv_commit_prefix(&a, &t, &p);
        // Pin a's path, then ask for 2 pages: only 1 is free and nothing is evictable.
        let pinned = m.kv_match_prefix(&a);
        assert_eq!(
            m.kv_alloc(2),
            Err(MemoryError::KvFull { wanted: 2, free: 1 })
        );
        m.kv_commit_prefix(&a, &pinned.blocks, &pinned);
        // Unpinned: the leaf (block 2), then its parent, can go.
        let got = m.kv_alloc(3).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(m.kv_cached_prefix_len(&a), 0);
    }

    #[test]
    fn unknown_policy_is_a_clear_error() {
        let cfg = MemoryConfig {
            kv_policy: "arc".into(),
            ..Default::default()
        };
        let err = NodeMemory::new(cfg, 4, 2, 2).unwrap_err();
        assert!(err.to_string().contains("memory.kv_policy"));
    }
}
