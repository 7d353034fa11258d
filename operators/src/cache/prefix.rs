//! The user-prefix KV cache: a radix index over full KV blocks of token
//! (item id) sequences, keyed by a chained block content hash (parent hash,
//! the block's tokens), as in SGLang's radix cache. Equal prefixes share
//! blocks; only unpinned leaves are evicted. A matched path is touched leaf
//! first, so ancestors are always more recent than their descendants and
//! recency order reaches leaves before the nodes above them.
//!
//! The hash only finds a candidate: a block is reused only when its stored
//! tokens and parent equal the request's, so a colliding history (crafted
//! or not) never reads KV computed from another sequence (the class of
//! vLLM's CVE-2025-25183). A colliding block is not cached, nor is anything
//! after it in that sequence.

use super::guided::GuidedPolicy;
use crate::eviction::{Key, KeyMap, key_map};
use crate::pool::PagePool;
use crate::predictor::AccessContext;

/// Hashes a block from its parent's hash and its tokens. Injectable so tests
/// can force collisions; correctness never depends on it being collision
/// free, only the hit rate does.
pub type BlockHasher = fn(Option<u64>, &[u32]) -> u64;

/// FNV-1a over the parent hash and the block's tokens: stable across runs.
pub fn block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
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

/// The longest cached prefix of a sequence; its blocks stay pinned until
/// [`PrefixKvCache::commit`] or [`PrefixKvCache::release`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefixMatch {
    /// Tokens covered by `blocks` (a multiple of the block size).
    pub matched_tokens: usize,
    /// Pool pages of the matched blocks, in sequence order.
    pub blocks: Vec<u32>,
    hashes: Vec<u64>,
}

#[derive(Debug, Clone)]
struct Block {
    page: u32,
    parent: Option<u64>,
    children: u32,
    pins: u32,
    /// What the KV was computed from (with the parent chain): compared on
    /// every hash hit.
    tokens: Box<[u32]>,
}

impl Block {
    /// Whether this block is the KV of `tokens` after the block `parent`.
    fn holds(&self, parent: Option<u64>, tokens: &[u32]) -> bool {
        self.parent == parent && *self.tokens == *tokens
    }
}

#[derive(Debug)]
pub struct PrefixKvCache {
    block_tokens: usize,
    hasher: BlockHasher,
    blocks: KeyMap<u64, Block>,
    policy: GuidedPolicy,
    reused_tokens: u64,
    total_tokens: u64,
    collisions: u64,
    /// Blocks with pins (matched by a request in flight). A match pins a
    /// path from the root, so every other block can be evicted, leaves
    /// first.
    pinned: usize,
    /// Tokens of the root blocks evicted since the last
    /// [`Self::take_evicted_roots`]; `None` until it is first called, so a
    /// cache nobody asks keeps no record.
    evicted_roots: Option<Vec<Box<[u32]>>>,
}

impl PrefixKvCache {
    pub fn new(block_tokens: usize, policy: GuidedPolicy) -> Self {
        Self::with_hasher(block_tokens, policy, block_hash)
    }

    /// A cache whose blocks are keyed by `hasher` (tests force collisions).
    pub fn with_hasher(block_tokens: usize, policy: GuidedPolicy, hasher: BlockHasher) -> Self {
        Self {
            block_tokens: block_tokens.max(1),
            hasher,
            blocks: key_map(),
            policy,
            reused_tokens: 0,
            total_tokens: 0,
            collisions: 0,
            pinned: 0,
            evicted_roots: None,
        }
    }

    /// An independent copy ([`GuidedPolicy::try_clone`] says when).
    pub fn try_clone(&self) -> Option<Self> {
        Some(Self {
            block_tokens: self.block_tokens,
            hasher: self.hasher,
            blocks: self.blocks.clone(),
            policy: self.policy.try_clone()?,
            reused_tokens: self.reused_tokens,
            total_tokens: self.total_tokens,
            collisions: self.collisions,
            pinned: self.pinned,
            evicted_roots: self.evicted_roots.clone(),
        })
    }

    /// Cached blocks (= pages held).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks (= pages) that evictions could free now: every unpinned one.
    pub fn evictable_blocks(&self) -> usize {
        debug_assert_eq!(
            self.pinned,
            self.blocks.values().filter(|b| b.pins > 0).count()
        );
        self.blocks.len() - self.pinned
    }

    /// (reused tokens, total tokens) over every committed request: a
    /// request matched again after a release (retried) counts once.
    pub fn token_counts(&self) -> (u64, u64) {
        (self.reused_tokens, self.total_tokens)
    }

    pub fn set_capacity(&mut self, blocks: usize) {
        self.policy.set_capacity(blocks);
    }

    /// Hash hits whose tokens or parent differed (each a refused reuse).
    pub fn collisions(&self) -> u64 {
        self.collisions
    }

    /// Longest cached prefix of `tokens`, pinned. Reuse is counted at
    /// [`Self::commit`]: a request released and matched again (one that
    /// waited for pages) would count twice here.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        let mut parent = None;
        let mut missed = None;
        for chunk in tokens.chunks_exact(self.block_tokens) {
            let h = (self.hasher)(parent, chunk);
            let Some(b) = self.blocks.get_mut(&h) else {
                missed = Some(h);
                break;
            };
            if !b.holds(parent, chunk) {
                self.collisions += 1;
                break;
            }
            if b.pins == 0 {
                self.pinned += 1;
            }
            b.pins += 1;
            m.blocks.push(b.page);
            m.hashes.push(h);
            parent = Some(h);
        }
        let n_blocks = tokens.len() / self.block_tokens;
        // Leaf first: ancestors end up more recent than descendants.
        for (depth, &h) in m.hashes.iter().enumerate().rev() {
            self.policy.access(h);
            self.policy
                .observed(h, AccessContext::block(depth, n_blocks));
        }
        // `kv_alloc` evicts before `commit` inserts: the policy must learn
        // of the miss first (LARU Alg. 1 line 10).
        if let Some(h) = missed {
            self.policy.missed(h);
        }
        m.matched_tokens = m.blocks.len() * self.block_tokens;
        m
    }

    /// Cached prefix length of `tokens`, touching nothing.
    pub fn cached_prefix_len(&self, tokens: &[u32]) -> usize {
        let mut parent = None;
        let mut n = 0;
        for chunk in tokens.chunks_exact(self.block_tokens) {
            let h = (self.hasher)(parent, chunk);
            if !self.blocks.get(&h).is_some_and(|b| b.holds(parent, chunk)) {
                break;
            }
            n += 1;
            parent = Some(h);
        }
        n * self.block_tokens
    }

    /// Evicts one unpinned leaf by policy and frees its page.
    pub fn evict_one(&mut self, pool: &mut PagePool) -> bool {
        let blocks = &self.blocks;
        let evictable = |h: Key| {
            blocks
                .get(&h)
                .is_some_and(|b| b.children == 0 && b.pins == 0)
        };
        let Some(h) = self.policy.evict(Some(&evictable)) else {
            return false;
        };
        let b = self.blocks.remove(&h).expect("policy tracks cached blocks");
        free_page(pool, b.page);
        match b.parent {
            Some(p) => {
                if let Some(pb) = self.blocks.get_mut(&p) {
                    pb.children -= 1;
                }
            }
            None => {
                if let Some(roots) = &mut self.evicted_roots {
                    roots.push(b.tokens);
                }
            }
        }
        true
    }

    /// Tokens of the root blocks (a sequence's first block, the last of it
    /// to go) evicted since the previous call: every sequence starting
    /// with one of them lost its whole cached prefix. The first call
    /// starts the record and returns nothing.
    pub fn take_evicted_roots(&mut self) -> Vec<Box<[u32]>> {
        self.evicted_roots.replace(Vec::new()).unwrap_or_default()
    }

    /// After a forward over `tokens` with pages `block_table` (the matched
    /// blocks first): new full blocks join the index, the partial tail page
    /// (and any block already cached by someone else) is freed, and the
    /// matched blocks are unpinned.
    pub fn commit(
        &mut self,
        pool: &mut PagePool,
        tokens: &[u32],
        block_table: &[u32],
        matched: &PrefixMatch,
    ) {
        let bt = self.block_tokens;
        // Counted here, once per served request, not at each match.
        self.reused_tokens += (matched.hashes.len() * bt) as u64;
        self.total_tokens += tokens.len() as u64;
        let n_blocks = tokens.len() / bt;
        let mut parent = matched.hashes.last().copied();
        let mut added = Vec::new();
        // After a collision nothing more of this sequence is cached: its
        // KV depends on every token before it, and the chain has no key.
        let mut chained = true;
        for (i, &page) in block_table.iter().enumerate().skip(matched.blocks.len()) {
            if !chained || i >= n_blocks {
                free_page(pool, page);
                continue;
            }
            let chunk = &tokens[i * bt..(i + 1) * bt];
            let h = (self.hasher)(parent, chunk);
            if let Some(b) = self.blocks.get(&h) {
                free_page(pool, page);
                if b.holds(parent, chunk) {
                    // Cached meanwhile: keep the older copy.
                } else {
                    self.collisions += 1;
                    chained = false;
                }
            } else {
                if let Some(p) = parent
                    && let Some(pb) = self.blocks.get_mut(&p)
                {
                    pb.children += 1;
                }
                self.blocks.insert(
                    h,
                    Block {
                        page,
                        parent,
                        children: 0,
                        pins: 0,
                        tokens: chunk.into(),
                    },
                );
                added.push((i, h));
            }
            parent = Some(h);
        }
        for &(depth, h) in added.iter().rev() {
            self.policy.access(h);
            self.policy.insert(h);
            self.policy
                .observed(h, AccessContext::block(depth, n_blocks));
        }
        self.unpin(matched);
    }

    /// The request ends without committing: unpins its match and frees its
    /// scratch pages.
    pub fn release(&mut self, pool: &mut PagePool, matched: &PrefixMatch, scratch: &[u32]) {
        for &p in scratch {
            free_page(pool, p);
        }
        self.unpin(matched);
    }

    fn unpin(&mut self, matched: &PrefixMatch) {
        for h in &matched.hashes {
            if let Some(b) = self.blocks.get_mut(h) {
                b.pins -= 1;
                if b.pins == 0 {
                    self.pinned -= 1;
                }
            }
        }
    }
}

/// Frees a KV page. A refused free (a double free) is counted by the pool
/// and surfaces as `MemoryStats::rejected_page_frees`; the cache goes on.
pub(crate) fn free_page(pool: &mut PagePool, page: u32) {
    let _ = pool.free_kv(page);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::{PolicyName, next_use_times};
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const BT: usize = 2;

    fn cache(hasher: BlockHasher) -> (PrefixKvCache, PagePool) {
        let policy = GuidedPolicy::new("lru", 64).unwrap();
        (
            PrefixKvCache::with_hasher(BT, policy, hasher),
            PagePool::new(64, 4),
        )
    }

    /// Runs one request over `tokens`: match, a page per block (the new
    /// ones stamped with `mark`), commit. Returns the matched pages.
    fn serve(c: &mut PrefixKvCache, pool: &mut PagePool, tokens: &[u32], mark: f32) -> Vec<u32> {
        let m = c.match_prefix(tokens);
        let mut table = m.blocks.clone();
        for _ in m.blocks.len()..tokens.len().div_ceil(BT) {
            let p = pool.alloc_kv().unwrap();
            pool.page_mut(p)[0] = mark;
            table.push(p);
        }
        c.commit(pool, tokens, &table, &m);
        m.blocks
    }

    /// Pages are held by cached blocks or free, nothing leaked or doubled.
    fn check_pages(c: &PrefixKvCache, pool: &PagePool) {
        assert_eq!(pool.free_pages() + c.blocks(), pool.pages());
        assert_eq!(pool.rejected_frees(), 0);
    }

    #[test]
    fn a_constant_hasher_never_shares_kv_between_different_histories() {
        let (mut c, mut pool) = cache(|_, _| 7);
        let a = [1, 2, 3, 4, 5];
        let b = [5, 6, 3, 4, 5];
        assert!(serve(&mut c, &mut pool, &a, 1.0).is_empty());
        // Every block hashes to 7: only a's first block can be cached.
        assert_eq!(c.blocks(), 1);
        let m = c.match_prefix(&b);
        assert_eq!(m.matched_tokens, 0, "b must not reuse a's KV");
        c.release(&mut pool, &m, &[]);
        assert!(serve(&mut c, &mut pool, &b, 2.0).is_empty());
        assert_eq!(c.cached_prefix_len(&b), 0);
        // Equal histories still share what is cached.
        let shared = serve(&mut c, &mut pool, &a, 3.0);
        assert_eq!(shared.len(), 1);
        assert_eq!(pool.page(shared[0])[0], 1.0, "a's own KV");
        assert_eq!(c.cached_prefix_len(&a), 2);
        assert!(c.collisions() > 0);
        check_pages(&c, &pool);
    }

    #[test]
    fn a_collision_breaks_the_chain_for_everything_after_it() {
        // Hashes depend on depth only: every sequence collides at every
        // depth, yet chains of one sequence stay distinct.
        let (mut c, mut pool) = cache(|parent, _| parent.map_or(1, |p| p + 1));
        let a = [1, 2, 3, 4, 5, 6, 7];
        assert!(serve(&mut c, &mut pool, &a, 1.0).is_empty());
        assert_eq!(c.cached_prefix_len(&a), 6);
        // Same first block, different second, same third: the third block's
        // KV attended over a's second block, so only the first is shared.
        let b = [1, 2, 9, 9, 5, 6];
        let m = c.match_prefix(&b);
        assert_eq!(m.matched_tokens, 2);
        c.release(&mut pool, &m, &[]);
        let shared = serve(&mut c, &mut pool, &b, 2.0);
        assert_eq!(shared.len(), 1);
        assert_eq!(
            c.cached_prefix_len(&b),
            2,
            "b's later blocks are not cached"
        );
        // Nothing in common: nothing shared.
        assert_eq!(c.cached_prefix_len(&[8, 8, 5, 6]), 0);
        // a still reuses all of its own blocks.
        let again = serve(&mut c, &mut pool, &a, 3.0);
        assert_eq!(again.len(), 3);
        assert!(again.iter().all(|&p| pool.page(p)[0] == 1.0));
        assert_eq!(c.blocks(), 3);
        check_pages(&c, &pool);
    }

    #[test]
    fn the_default_hasher_shares_equal_prefixes_only() {
        let (mut c, mut pool) = cache(block_hash);
        let a = [1, 2, 3, 4, 5];
        serve(&mut c, &mut pool, &a, 1.0);
        assert_eq!(serve(&mut c, &mut pool, &[1, 2, 3, 4, 6, 7], 2.0).len(), 2);
        assert_eq!(serve(&mut c, &mut pool, &[1, 2, 9, 4], 3.0).len(), 1);
        assert_eq!(serve(&mut c, &mut pool, &[2, 1, 3, 4], 4.0).len(), 0);
        assert_eq!(c.collisions(), 0);
        // Eviction frees leaves only and keeps the pool consistent.
        while c.evict_one(&mut pool) {}
        assert_eq!(c.blocks(), 0);
        check_pages(&c, &pool);
    }

    /// A request released and matched again (it waited for pages, a later
    /// sub-batch or a reclaim) counts its tokens and reuse once, when it
    /// is served; a request that only fails counts nothing.
    #[test]
    fn a_retried_request_counts_its_tokens_once() {
        let (mut c, mut pool) = cache(block_hash);
        serve(&mut c, &mut pool, &[1, 2, 3, 4, 5], 1.0);
        assert_eq!(c.token_counts(), (0, 5));
        let b = [1, 2, 3, 4, 9, 9];
        let first = c.match_prefix(&b);
        assert_eq!(first.matched_tokens, 4);
        c.release(&mut pool, &first, &[]);
        assert_eq!(c.token_counts(), (0, 5), "a release counts nothing");
        assert_eq!(serve(&mut c, &mut pool, &b, 2.0).len(), 2);
        assert_eq!(c.token_counts(), (4, 11));
        check_pages(&c, &pool);
    }

    /// Root blocks go last (leaves first), and each is recorded once asked:
    /// the sequences that start with it lost all of their cached prefix.
    #[test]
    fn evicted_root_blocks_are_recorded_from_the_first_ask() {
        let (mut c, mut pool) = cache(block_hash);
        serve(&mut c, &mut pool, &[1, 2, 3, 4, 5, 6], 1.0);
        assert!(c.evict_one(&mut pool));
        assert!(c.take_evicted_roots().is_empty(), "not recording yet");
        serve(&mut c, &mut pool, &[7, 8, 3, 4], 2.0);
        serve(&mut c, &mut pool, &[1, 2, 9, 9], 3.0);
        while c.evict_one(&mut pool) {}
        let mut roots = c.take_evicted_roots();
        roots.sort();
        assert_eq!(roots, [[1, 2].into(), [7, 8].into()]);
        assert!(c.take_evicted_roots().is_empty(), "drained");
        check_pages(&c, &pool);
    }

    /// Hits of `policy` over one-block requests of `keys` in a cache of `k`
    /// blocks, each block predicted by LCR's adversary (noise p = 1: minus
    /// its true next request), served as a node does: match, `kv_alloc`'s
    /// evictions, commit.
    fn adversarial_hits(policy: &str, keys: &[u64], k: usize) -> usize {
        let policy = PolicyName::parse(policy).unwrap().build_online(k).unwrap();
        let mut c = PrefixKvCache::new(BT, GuidedPolicy::without_predictor(policy));
        c.set_capacity(k);
        let mut pool = PagePool::new(k, 1);
        let next = next_use_times(keys);
        let mut hits = 0;
        for (&key, &next) in keys.iter().zip(&next) {
            let tokens = [key as u32, 0];
            let m = c.match_prefix(&tokens);
            let mut table = m.blocks.clone();
            if table.is_empty() {
                while pool.free_pages() == 0 {
                    assert!(c.evict_one(&mut pool));
                }
                table.push(pool.alloc_kv().unwrap());
            } else {
                hits += 1;
            }
            c.commit(&mut pool, &tokens, &table, &m);
            c.policy
                .set_prediction(block_hash(None, &tokens), -(next as f64));
        }
        check_pages(&c, &pool);
        hits
    }

    #[test]
    fn laru_falls_back_to_lru_when_adversarial_predictions_prove_wrong() {
        // Zipf(0.9) over 1,000 users.
        let mut rng = ChaCha8Rng::seed_from_u64(42);
        let cdf: Vec<f64> = (1..=1_000)
            .scan(0.0, |sum, i| {
                *sum += 1.0 / f64::powf(i as f64, 0.9);
                Some(*sum)
            })
            .collect();
        let total = cdf[cdf.len() - 1];
        let keys: Vec<u64> = (0..40_000)
            .map(|_| {
                let u = rng.random::<f64>() * total;
                cdf.partition_point(|&c| c < u) as u64
            })
            .collect();
        let k = 50;
        let [lru, laru, fpb] = ["lru", "laru", "fpb"].map(|p| adversarial_hits(p, &keys, k));
        // LARU loses a little to LRU while it learns λ; following the
        // adversary blindly (FPB, and LARU blind to its misses) hits ~2%.
        assert!(4 * laru >= 3 * lru, "laru {laru} hits, lru {lru}");
        assert!(laru >= 10 * fpb, "laru {laru} hits, fpb {fpb}");
    }
}
