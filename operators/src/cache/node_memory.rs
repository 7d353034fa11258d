//! [`NodeMemory`]: what a serving node calls. One [`PagePool`] of M bytes
//! in pages of one KV block; α of it lent to the EMB cache, the rest shared
//! by the user-prefix and item-prefix KV caches; a [`Link`] pacing host
//! transfers. `set_alpha` moves the boundary (HLEM §IV-B): growing EMB takes
//! free KV pages first and evicts KV entries only when none is free;
//! shrinking EMB evicts rows in policy order and compacts the rest. KV
//! blocks never move.

use serde::{Deserialize, Serialize};

use super::emb::{EmbCache, TableCounters, emb_key};
use super::guided::GuidedPolicy;
use super::item::ItemKvCache;
use super::prefix::{PrefixKvCache, PrefixMatch};
use crate::eviction::{Key, KeyMap, KeySet, key_map};
use crate::link::{Link, LinkConfig, RefillCounts};
use crate::pool::PagePool;

/// Memory of one node. Page and row sizes come from the model.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeMemoryConfig {
    /// Pool size M in bytes.
    pub pool_bytes: u64,
    /// Floats per page = one KV block (`ModelConfig::kv_block_floats`).
    pub page_floats: usize,
    /// Tokens per KV block.
    pub block_tokens: usize,
    /// Floats per EMB row (d_model).
    pub emb_row_floats: usize,
    /// EMB share α of the pool, in [0, 1].
    pub alpha: f64,
    /// lru | laru | fpb | hf.
    #[serde(default = "lru")]
    pub emb_policy: String,
    #[serde(default = "lru")]
    pub user_kv_policy: String,
    #[serde(default = "lru")]
    pub item_kv_policy: String,
    #[serde(default)]
    pub link: LinkConfig,
}

fn lru() -> String {
    "lru".into()
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MemoryError {
    #[error("memory.alpha must be in [0, 1] (got {0})")]
    Alpha(f64),
    #[error("memory.{field}: {msg}")]
    Policy { field: &'static str, msg: String },
    #[error("memory.{field} must be positive")]
    Zero { field: &'static str },
    #[error("memory.emb_row_floats {row} is larger than a page of {page} floats")]
    RowTooLarge { row: usize, page: usize },
    #[error(
        "memory.pool_mib: {0} (the virtual clock holds no floats and allocates none; \
         with the wall clock, pick a pool this host can hold)"
    )]
    Alloc(#[from] crate::pool::PoolAllocError),
    #[error("memory.pool_bytes {pool_bytes} holds no page of {page_bytes} bytes")]
    TooSmall { pool_bytes: u64, page_bytes: u64 },
    #[error(
        "KV share exhausted: {wanted} pages wanted, {free} free and {evictable} more that \
         evicting every unpinned entry would free"
    )]
    KvFull {
        wanted: usize,
        free: usize,
        evictable: usize,
    },
    #[error(
        "memory.{field} = {policy:?} cannot be copied (its state is not all it decides by); \
         the oracle needs lru"
    )]
    NotCloneable { field: &'static str, policy: String },
}

/// What one `set_alpha` did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BoundaryMove {
    /// Pages that changed tenant (+ to EMB, − to KV).
    pub pages_to_emb: i64,
    pub emb_rows_evicted: usize,
    /// Those rows, as (table, row): the node counts them out of its shard
    /// residency one by one instead of recounting every shard.
    #[serde(skip)]
    pub emb_evicted: Vec<(u16, u32)>,
    pub kv_entries_evicted: usize,
    /// Refill this move queued on the link's low-priority lane (rows
    /// already on it from an earlier move are not counted again).
    pub refill_rows: usize,
    pub refill_bytes: u64,
    /// α in effect afterwards (pinned KV pages can keep EMB from growing).
    pub alpha: f64,
}

/// Telemetry snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemoryStats {
    pub alpha: f64,
    pub pages: usize,
    pub page_bytes: usize,
    pub emb_pages: usize,
    pub user_kv_pages: usize,
    pub item_kv_pages: usize,
    /// KV pages in use by requests but not cached (scratch).
    pub scratch_pages: usize,
    pub free_pages: usize,
    pub emb_rows: usize,
    pub emb_capacity_rows: usize,
    /// Hits and misses per EMB table.
    pub emb_tables: Vec<TableCounters>,
    pub kv_reused_tokens: u64,
    pub kv_total_tokens: u64,
    pub item_kv_hits: u64,
    pub item_kv_misses: u64,
    pub refill_queued_bytes: u64,
    pub refill_bytes_per_s: f64,
    /// Refill jobs by outcome (submitted = completed + pending + cancelled).
    pub refill_jobs: RefillCounts,
    /// Page frees the pool refused (double frees, wrong tenant): each is a
    /// bug, counted instead of corrupting the free list.
    pub rejected_page_frees: u64,
    /// Pages taken back from EMB (α lowered) because a request's KV did
    /// not fit in the KV share: a request never fails while EMB holds pages.
    pub kv_reclaimed_pages: u64,
}

impl MemoryStats {
    /// Reused tokens / total tokens of the user-prefix cache.
    pub fn kv_hit_rate(&self) -> f64 {
        self.kv_reused_tokens as f64 / self.kv_total_tokens.max(1) as f64
    }
}

/// Which KV cache asks for pages (it gives up its own entries first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvTenant {
    UserPrefix,
    ItemPrefix,
}

/// The node's device memory: pool, caches and link.
#[derive(Debug)]
pub struct NodeMemory {
    cfg: NodeMemoryConfig,
    pool: PagePool,
    emb: EmbCache,
    user_kv: PrefixKvCache,
    item_kv: ItemKvCache,
    link: Link,
    /// Rows waiting on the refill lane, by link tag (queued, or finished and
    /// not yet placed).
    refill_rows: KeyMap<u64, (u16, u32)>,
    next_refill_tag: u64,
    alpha: f64,
    /// Pages the KV share took back from EMB because a request did not fit
    /// otherwise.
    kv_reclaimed_pages: u64,
}

impl NodeMemory {
    pub fn new(cfg: NodeMemoryConfig) -> Result<Self, MemoryError> {
        Self::with_storage(cfg, false)
    }

    /// [`NodeMemory::new`], holding the pages' floats or, with
    /// `metadata_only`, who holds which page alone (the virtual clock:
    /// [`NodeMemory::keep_metadata_only`] from the start, so a pool sized
    /// for a device larger than this host is never allocated).
    pub fn with_storage(cfg: NodeMemoryConfig, metadata_only: bool) -> Result<Self, MemoryError> {
        if !(0.0..=1.0).contains(&cfg.alpha) {
            return Err(MemoryError::Alpha(cfg.alpha));
        }
        for (field, v) in [
            ("page_floats", cfg.page_floats),
            ("block_tokens", cfg.block_tokens),
            ("emb_row_floats", cfg.emb_row_floats),
        ] {
            if v == 0 {
                return Err(MemoryError::Zero { field });
            }
        }
        if cfg.emb_row_floats > cfg.page_floats {
            return Err(MemoryError::RowTooLarge {
                row: cfg.emb_row_floats,
                page: cfg.page_floats,
            });
        }
        let page_bytes = (cfg.page_floats * 4) as u64;
        let pages = (cfg.pool_bytes / page_bytes) as usize;
        if pages == 0 {
            return Err(MemoryError::TooSmall {
                pool_bytes: cfg.pool_bytes,
                page_bytes,
            });
        }
        let policy = |field: &'static str, name: &str, cap: usize| {
            GuidedPolicy::new(name, cap).map_err(|e| MemoryError::Policy {
                field,
                msg: e.to_string(),
            })
        };
        let emb_pages = ((pages as f64) * cfg.alpha).round() as usize;
        let rows_per_page = cfg.page_floats / cfg.emb_row_floats;
        let mut pool = PagePool::try_new(pages, cfg.page_floats, metadata_only)?;
        let mut emb = EmbCache::new(
            cfg.emb_row_floats,
            cfg.page_floats,
            policy("emb_policy", &cfg.emb_policy, emb_pages * rows_per_page)?,
        );
        emb.grow(pool.lend_to_emb(emb_pages));
        let kv_pages = pages - emb_pages;
        let user_kv = PrefixKvCache::new(
            cfg.block_tokens,
            policy("user_kv_policy", &cfg.user_kv_policy, kv_pages)?,
        );
        let mut item_kv =
            ItemKvCache::new(policy("item_kv_policy", &cfg.item_kv_policy, kv_pages)?);
        item_kv.set_capacity_pages(kv_pages);
        Ok(Self {
            link: Link::new(cfg.link),
            alpha: emb_pages as f64 / pages as f64,
            pool,
            emb,
            user_kv,
            item_kv,
            refill_rows: key_map(),
            next_refill_tag: 0,
            kv_reclaimed_pages: 0,
            cfg,
        })
    }

    /// α in effect (EMB pages / pages).
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    pub fn config(&self) -> &NodeMemoryConfig {
        &self.cfg
    }

    /// The pool as KV block storage (block id = page id) for the model.
    pub fn kv_store(&mut self) -> &mut PagePool {
        &mut self.pool
    }

    pub fn pool(&self) -> &PagePool {
        &self.pool
    }

    /// An independent copy of the pool and caches in their current state
    /// (the oracle α* replays an epoch from copies). Refused for a policy
    /// that learns online (see [`GuidedPolicy::try_clone`]).
    pub fn try_clone(&self) -> Result<Self, MemoryError> {
        let refused = |field: &'static str, policy: &str| MemoryError::NotCloneable {
            field,
            policy: policy.to_string(),
        };
        Ok(Self {
            cfg: self.cfg.clone(),
            pool: self.pool.clone(),
            emb: self
                .emb
                .try_clone()
                .ok_or_else(|| refused("emb_policy", &self.cfg.emb_policy))?,
            user_kv: self
                .user_kv
                .try_clone()
                .ok_or_else(|| refused("user_kv_policy", &self.cfg.user_kv_policy))?,
            item_kv: self
                .item_kv
                .try_clone()
                .ok_or_else(|| refused("item_kv_policy", &self.cfg.item_kv_policy))?,
            link: self.link.clone(),
            refill_rows: self.refill_rows.clone(),
            next_refill_tag: self.next_refill_tag,
            alpha: self.alpha,
            kv_reclaimed_pages: self.kv_reclaimed_pages,
        })
    }

    /// The pool keeps page ownership but no floats (the virtual clock).
    pub fn keep_metadata_only(&mut self) {
        self.pool.keep_metadata_only();
    }

    pub fn link(&mut self) -> &mut Link {
        &mut self.link
    }

    // ---- EMB ----

    /// A lookup of (table, row): the row when resident (a hit), else `None`
    /// (a miss; fetch it from the host tier and call `emb_insert`).
    pub fn emb_lookup(&mut self, table: u16, row: u32) -> Option<&[f32]> {
        self.emb.lookup(&self.pool, table, row)
    }

    /// Caches a row fetched after a miss; returns evicted rows.
    pub fn emb_insert(&mut self, table: u16, row: u32, values: &[f32]) -> Vec<(u16, u32)> {
        self.emb.insert(&mut self.pool, table, row, values)
    }

    /// Bytes of one EMB row (for link transfers).
    pub fn emb_row_bytes(&self) -> u64 {
        (self.cfg.emb_row_floats * 4) as u64
    }

    /// Whether (table, row) is resident (no counting, no recency change).
    pub fn emb_contains(&self, table: u16, row: u32) -> bool {
        self.emb.contains(table, row)
    }

    /// Advances the refill lane to `now` (ns) and caches the rows whose
    /// transfer completed, reading values from the host tier `host`.
    /// Returns the (table, row)s it placed: a refill only fills free EMB
    /// slots and never evicts, so they are the whole change to what the
    /// EMB cache holds.
    pub fn advance_refill(
        &mut self,
        now: u64,
        host: &dyn Fn(u16, u32) -> Vec<f32>,
    ) -> Vec<(u16, u32)> {
        let mut placed = Vec::new();
        for tag in self.link.advance(now) {
            let Some((t, r)) = self.refill_rows.remove(&tag) else {
                continue;
            };
            if self.emb.refill(&mut self.pool, t, r, &host(t, r)) {
                placed.push((t, r));
            }
        }
        placed
    }

    // ---- user-prefix KV ----

    /// Longest cached prefix of `tokens` (whole blocks), pinned until
    /// `kv_commit` (which counts reused and total tokens, once per served
    /// request) or `kv_release`.
    pub fn kv_match(&mut self, tokens: &[u32]) -> PrefixMatch {
        self.user_kv.match_prefix(tokens)
    }

    /// Cached prefix length without touching recency, pins or counters.
    pub fn kv_cached_prefix_len(&self, tokens: &[u32]) -> usize {
        self.user_kv.cached_prefix_len(tokens)
    }

    /// `n` KV pages for new blocks or scratch, evicting unpinned entries by
    /// policy (the asking cache's own first) when no page is free. When even
    /// evicting every unpinned entry would not make room it fails at once
    /// and evicts nothing: the request waits for a later sub-batch or the
    /// KV share grows, and the cached prefixes of everyone else stay.
    pub fn kv_alloc(&mut self, n: usize, tenant: KvTenant) -> Result<Vec<u32>, MemoryError> {
        let free = self.pool.free_pages();
        let evictable = self.user_kv.evictable_blocks() + self.item_kv.evictable_pages();
        if n > free + evictable {
            return Err(MemoryError::KvFull {
                wanted: n,
                free,
                evictable,
            });
        }
        while self.pool.free_pages() < n {
            let freed = match tenant {
                KvTenant::UserPrefix => {
                    self.user_kv.evict_one(&mut self.pool) || self.item_kv.evict_one(&mut self.pool)
                }
                KvTenant::ItemPrefix => {
                    self.item_kv.evict_one(&mut self.pool) || self.user_kv.evict_one(&mut self.pool)
                }
            };
            if !freed {
                // Counted evictable, yet the policies found nothing to evict.
                return Err(MemoryError::KvFull {
                    wanted: n,
                    free: self.pool.free_pages(),
                    evictable: 0,
                });
            }
        }
        Ok((0..n)
            .map(|_| self.pool.alloc_kv().expect("counted free"))
            .collect())
    }

    /// The KV share takes `pages` back from EMB (α goes down, as far as 0)
    /// for a request that does not fit alone: an embedding row can be
    /// fetched again, a request that does not fit would fail. Returns the
    /// pages moved (fewer when EMB holds fewer) and the rows evicted.
    pub fn reclaim_for_kv(&mut self, pages: usize) -> (usize, Vec<(u16, u32)>) {
        let (back, evicted) = self.shrink_emb(pages);
        self.kv_reclaimed_pages += back as u64;
        self.settle_boundary();
        (back, evicted)
    }

    /// First blocks of user prefixes evicted since the last call: every
    /// sequence starting with one lost its whole cached prefix. The first
    /// call starts the record (a cache nobody asks keeps none).
    pub fn kv_take_evicted_heads(&mut self) -> Vec<Box<[u32]>> {
        self.user_kv.take_evicted_roots()
    }

    /// After the forward: new full blocks of `tokens` join the radix index,
    /// the tail page is freed, the match is unpinned.
    pub fn kv_commit(&mut self, tokens: &[u32], block_table: &[u32], matched: &PrefixMatch) {
        self.user_kv
            .commit(&mut self.pool, tokens, block_table, matched);
    }

    /// Ends a request without caching: unpins the match, frees scratch pages.
    pub fn kv_release(&mut self, matched: &PrefixMatch, scratch: &[u32]) {
        self.user_kv.release(&mut self.pool, matched, scratch);
    }

    // ---- item-prefix KV ----

    /// The item's cached KV blocks, pinned until `item_unpin`; `None` on a miss.
    pub fn item_get(&mut self, item: u32) -> Option<Vec<u32>> {
        self.item_kv.get(item)
    }

    /// Caches an item's blocks (pages from `kv_alloc(.., ItemPrefix)`, already
    /// written), pinned once. An item cached meanwhile keeps its older copy
    /// (pinned once more) and `pages` are freed.
    pub fn item_insert(&mut self, item: u32, pages: Vec<u32>) {
        self.item_kv.insert(&mut self.pool, item, pages);
    }

    pub fn item_unpin(&mut self, item: u32) {
        self.item_kv.unpin(item);
    }

    // ---- boundary ----

    /// Moves the EMB/KV boundary to `alpha` (HLEM §IV-B) at `now` (ns of the
    /// link's clock: refill starts then). Returns what moved.
    pub fn set_alpha(&mut self, alpha: f64, now: u64) -> Result<BoundaryMove, MemoryError> {
        if !(0.0..=1.0).contains(&alpha) {
            return Err(MemoryError::Alpha(alpha));
        }
        let pages = self.pool.pages();
        let target = ((pages as f64) * alpha).round() as usize;
        let current = self.emb.pages().len();
        let mut mv = BoundaryMove::default();
        if target > current {
            let want = target - current;
            // Free KV pages first; evict KV entries only for the rest.
            while self.pool.free_pages() < want {
                let freed = self.user_kv.evict_one(&mut self.pool)
                    || self.item_kv.evict_one(&mut self.pool);
                if !freed {
                    break; // pinned by running requests
                }
                mv.kv_entries_evicted += 1;
            }
            let lent = self.pool.lend_to_emb(want);
            mv.pages_to_emb = lent.len() as i64;
            self.emb.grow(lent);
            // Refill the new room with recently evicted rows, in background.
            // Rows already on the lane (queued, or across and not yet
            // placed) keep their jobs and their slots: choosing one again
            // would send it, and charge the link, twice.
            let on_lane: KeySet<Key> = (self.refill_rows.values())
                .filter(|&&(t, r)| !self.emb.contains(t, r))
                .map(|&(t, r)| emb_key(t, r))
                .collect();
            let room = (self.emb.capacity_rows() - self.emb.rows()).saturating_sub(on_lane.len());
            let rows = self.emb.refill_candidates(room, &on_lane);
            let row_bytes = self.emb_row_bytes();
            for &row in &rows {
                let tag = self.next_refill_tag;
                self.next_refill_tag += 1;
                self.link.queue_refill(row_bytes, tag, now);
                self.refill_rows.insert(tag, row);
            }
            mv.refill_rows = rows.len();
            mv.refill_bytes = rows.len() as u64 * row_bytes;
        } else if target < current {
            let (back, evicted) = self.shrink_emb(current - target);
            mv.pages_to_emb = -(back as i64);
            mv.emb_rows_evicted = evicted.len();
            mv.emb_evicted = evicted;
        }
        self.settle_boundary();
        mv.alpha = self.alpha;
        Ok(mv)
    }

    /// Gives up to `pages` EMB pages back to the pool (evicting their
    /// rows) and drops the refill in flight: (pages given, rows evicted).
    fn shrink_emb(&mut self, pages: usize) -> (usize, Vec<(u16, u32)>) {
        let (back, evicted) = self.emb.shrink(&mut self.pool, pages);
        // A page the EMB cache did not hold is refused and counted by the
        // pool (`rejected_page_frees`); the move itself stands.
        let _ = self.pool.return_from_emb(&back);
        self.cancel_refill();
        (back.len(), evicted)
    }

    /// The KV caches' capacity and α after the boundary moved.
    fn settle_boundary(&mut self) {
        let pages = self.pool.pages();
        let kv_pages = pages - self.emb.pages().len();
        self.user_kv.set_capacity(kv_pages);
        self.item_kv.set_capacity_pages(kv_pages);
        self.alpha = self.emb.pages().len() as f64 / pages as f64;
    }

    /// Drops unfinished refill jobs and forgets their rows; rows whose
    /// transfer already finished are still placed by `advance_refill`.
    fn cancel_refill(&mut self) {
        for tag in self.link.cancel_refill() {
            self.refill_rows.remove(&tag);
        }
    }

    /// Telemetry snapshot.
    pub fn stats(&self) -> MemoryStats {
        let (reused, total) = self.user_kv.token_counts();
        let (ih, im) = self.item_kv.counts();
        let pages = self.pool.pages();
        let emb_pages = self.emb.pages().len();
        let user = self.user_kv.blocks();
        let item = self.item_kv.pages();
        let free = self.pool.free_pages();
        MemoryStats {
            alpha: self.alpha,
            pages,
            page_bytes: self.pool.page_bytes(),
            emb_pages,
            user_kv_pages: user,
            item_kv_pages: item,
            scratch_pages: pages - emb_pages - user - item - free,
            free_pages: free,
            emb_rows: self.emb.rows(),
            emb_capacity_rows: self.emb.capacity_rows(),
            emb_tables: self.emb.counters().to_vec(),
            kv_reused_tokens: reused,
            kv_total_tokens: total,
            item_kv_hits: ih,
            item_kv_misses: im,
            refill_queued_bytes: self.link.refill_queued_bytes(),
            refill_bytes_per_s: self.link.refill_bandwidth(),
            refill_jobs: self.link.refill_counts(),
            rejected_page_frees: self.pool.rejected_frees(),
            kv_reclaimed_pages: self.kv_reclaimed_pages,
        }
    }
}
