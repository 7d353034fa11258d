//! The user-prefix KV cache: a radix index over full KV blocks of token
//! (item id) sequences, keyed by a chained block content hash (parent hash,
//! the block's tokens), as in SGLang's radix cache. Equal prefixes share
//! blocks; only unpinned leaves are evicted. A matched path is touched leaf
//! first, so ancestors are always more recent than their descendants and
//! recency order reaches leaves before the nodes above them.

use super::guided::GuidedPolicy;
use crate::eviction::{Key, KeyMap, key_map};
use crate::pool::PagePool;
use crate::predictor::AccessContext;

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

#[derive(Debug, Clone, Copy)]
struct Block {
    page: u32,
    parent: Option<u64>,
    children: u32,
    pins: u32,
}

#[derive(Debug)]
pub struct PrefixKvCache {
    block_tokens: usize,
    blocks: KeyMap<u64, Block>,
    policy: GuidedPolicy,
    reused_tokens: u64,
    total_tokens: u64,
}

impl PrefixKvCache {
    pub fn new(block_tokens: usize, policy: GuidedPolicy) -> Self {
        Self {
            block_tokens: block_tokens.max(1),
            blocks: key_map(),
            policy,
            reused_tokens: 0,
            total_tokens: 0,
        }
    }

    /// Cached blocks (= pages held).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// (reused tokens, total tokens) over every match so far.
    pub fn token_counts(&self) -> (u64, u64) {
        (self.reused_tokens, self.total_tokens)
    }

    pub fn set_capacity(&mut self, blocks: usize) {
        self.policy.set_capacity(blocks);
    }

    fn hashes(&self, tokens: &[u32]) -> Vec<u64> {
        let mut parent = None;
        tokens
            .chunks_exact(self.block_tokens)
            .map(|c| {
                let h = block_hash(parent, c);
                parent = Some(h);
                h
            })
            .collect()
    }

    /// Longest cached prefix of `tokens`, pinned; counts reuse.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        let hashes = self.hashes(tokens);
        for &h in &hashes {
            let Some(b) = self.blocks.get_mut(&h) else {
                break;
            };
            b.pins += 1;
            m.blocks.push(b.page);
            m.hashes.push(h);
        }
        // Leaf first: ancestors end up more recent than descendants.
        for (depth, &h) in m.hashes.iter().enumerate().rev() {
            self.policy.access(h);
            self.policy
                .observed(h, AccessContext::block(depth, hashes.len()));
        }
        m.matched_tokens = m.blocks.len() * self.block_tokens;
        self.reused_tokens += m.matched_tokens as u64;
        self.total_tokens += tokens.len() as u64;
        m
    }

    /// Cached prefix length of `tokens`, touching nothing.
    pub fn cached_prefix_len(&self, tokens: &[u32]) -> usize {
        self.hashes(tokens)
            .into_iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count()
            * self.block_tokens
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
        if let Some(p) = b.parent
            && let Some(pb) = self.blocks.get_mut(&p)
        {
            pb.children -= 1;
        }
        pool.free_kv(b.page);
        true
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
        let hashes = self.hashes(tokens);
        let mut parent = matched.hashes.last().copied();
        let mut added = Vec::new();
        for (i, &page) in block_table.iter().enumerate().skip(matched.blocks.len()) {
            let Some(&h) = hashes.get(i) else {
                pool.free_kv(page);
                continue;
            };
            if self.blocks.contains_key(&h) {
                pool.free_kv(page); // cached meanwhile: keep the older copy
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
                .observed(h, AccessContext::block(depth, hashes.len()));
        }
        self.unpin(matched);
    }

    /// The request ends without committing: unpins its match and frees its
    /// scratch pages.
    pub fn release(&mut self, pool: &mut PagePool, matched: &PrefixMatch, scratch: &[u32]) {
        for &p in scratch {
            pool.free_kv(p);
        }
        self.unpin(matched);
    }

    fn unpin(&mut self, matched: &PrefixMatch) {
        for h in &matched.hashes {
            if let Some(b) = self.blocks.get_mut(h) {
                b.pins -= 1;
            }
        }
    }
}
