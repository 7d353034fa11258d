//! Prefix reuse: a request runs on its user's history KV, computed on top
//! of the longest prefix already cached. Afterwards the history's full
//! blocks join the prefix cache; on any failure every page the request
//! took is given back through one release path, and nothing is cached.

use std::collections::BTreeSet;

use crate::cache::{KvTenant, NodeMemory, PrefixMatch};
use crate::lru::LruMap;

use super::ServeError;

/// The user's history KV while a request runs on it.
#[derive(Debug)]
pub struct UserPrefix {
    /// KV blocks of the history: the matched ones, then fresh ones.
    pub block_table: Vec<u32>,
    /// History tokens whose KV came from the cache.
    pub reused: usize,
    matched: PrefixMatch,
}

/// Users whose prefix the node tracks, by the tokens of their history's
/// first KV block: the user's prefix is resident while that block is.
/// Bounded by `max_users` (least recently served dropped first).
#[derive(Clone, Debug)]
pub struct UserPrefixes {
    heads: LruMap<Vec<u32>>,
    /// Users served since the last residency report.
    touched: BTreeSet<u64>,
    block_size: usize,
}

impl UserPrefixes {
    pub fn new(max_users: usize, block_size: usize) -> Self {
        Self {
            heads: LruMap::new(max_users),
            touched: BTreeSet::new(),
            block_size,
        }
    }

    /// The first half of serving on a prefix: matches the
    /// longest cached prefix of `history` (pinning it) and allocates blocks
    /// for the rest, computing nothing. The caller prefills the suffix, then
    /// ends the request with [`Self::commit`] or [`release`].
    pub fn reserve(
        &self,
        memory: &mut NodeMemory,
        history: &[u32],
    ) -> Result<UserPrefix, ServeError> {
        let matched = memory.kv_match(history);
        let reused = matched.matched_tokens.min(history.len());
        let blocks_needed = history
            .len()
            .div_ceil(self.block_size)
            .saturating_sub(matched.blocks.len());
        let mut prefix = UserPrefix {
            block_table: matched.blocks.clone(),
            reused,
            matched,
        };
        match memory.kv_alloc(blocks_needed, KvTenant::UserPrefix) {
            Ok(fresh) => prefix.block_table.extend_from_slice(&fresh),
            Err(e) => {
                // The matched blocks are pinned: unpin them.
                release(memory, &prefix);
                return Err(e.into());
            }
        }
        Ok(prefix)
    }

    /// Full blocks of the history join the prefix cache; the partial tail
    /// block is scratch.
    pub fn commit(
        &mut self,
        memory: &mut NodeMemory,
        user_id: u64,
        history: &[u32],
        prefix: &UserPrefix,
    ) {
        memory.kv_commit(history, &prefix.block_table, &prefix.matched);
        let block = self.block_size;
        if history.len() >= block {
            let head = &history[..block];
            let kept = self.heads.get_or_insert_with(user_id, || head.to_vec());
            if kept.as_slice() != head {
                // The history's first block changed (e.g. truncated): track the new one.
                kept.clear();
                kept.extend_from_slice(head);
            }
            self.touched.insert(user_id);
        }
    }

    /// Whether `user`'s prefix (at least its first block) is cached now.
    pub fn is_resident(&self, memory: &NodeMemory, user: u64) -> bool {
        self.heads
            .get(user)
            .is_some_and(|head| memory.kv_cached_prefix_len(head) >= self.block_size)
    }

    /// Users served since the last call.
    pub fn take_touched(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.touched)
    }

    pub fn len(&self) -> usize {
        self.heads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }

    pub fn peak_len(&self) -> usize {
        self.heads.peak_len()
    }

    /// Heads dropped because the table was full.
    pub fn evictions(&self) -> u64 {
        self.heads.evictions()
    }
}

/// Gives a request's pages back without caching anything: the one release
/// path of a failed request.
pub fn release(memory: &mut NodeMemory, prefix: &UserPrefix) {
    let fresh = &prefix.block_table[prefix.matched.blocks.len()..];
    memory.kv_release(&prefix.matched, fresh);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::NodeMemoryConfig;
    use crate::link::LinkConfig;
    use crate::pool::PagePool;
    use grflow_kernels::GrModel;
    use grflow_kernels::ModelConfig;

    fn setup(pool_pages: u64) -> (NodeMemory, GrModel) {
        let model = GrModel::new(ModelConfig::preset("small").unwrap(), 3);
        let cfg = model.config();
        let page_floats = cfg.kv_block_floats();
        let memory = NodeMemory::new(NodeMemoryConfig {
            pool_bytes: pool_pages * page_floats as u64 * 4,
            page_floats,
            block_tokens: cfg.block_size,
            emb_row_floats: cfg.d_model,
            alpha: 0.0,
            emb_policy: "lru".into(),
            user_kv_policy: "lru".into(),
            item_kv_policy: "lru".into(),
            link: LinkConfig::default(),
        })
        .unwrap();
        (memory, model)
    }

    /// Serving on a prefix as the node does: reserve, prefill the
    /// uncached suffix, run `body`, then commit or release.
    fn with_prefix<T>(
        prefixes: &mut UserPrefixes,
        memory: &mut NodeMemory,
        model: &GrModel,
        user_id: u64,
        history: &[u32],
        history_tokens: &[f32],
        body: impl FnOnce(&PagePool, &UserPrefix) -> Result<T, ServeError>,
    ) -> Result<(T, usize), ServeError> {
        let prefix = prefixes.reserve(memory, history)?;
        let d = model.config().d_model;
        let result = model
            .prefill(
                memory.kv_store(),
                &prefix.block_table,
                prefix.reused,
                &history_tokens[prefix.reused * d..],
            )
            .map_err(|e| ServeError::Model(e.to_string()))
            .and_then(|()| body(memory.kv_store(), &prefix));
        match result {
            Ok(value) => {
                prefixes.commit(memory, user_id, history, &prefix);
                Ok((value, prefix.reused))
            }
            Err(e) => {
                release(memory, &prefix);
                Err(e)
            }
        }
    }

    fn tokens(model: &GrModel, n: usize) -> Vec<f32> {
        (0..n * model.config().d_model)
            .map(|i| ((i % 17) as f32 - 8.0) / 16.0)
            .collect()
    }

    #[test]
    fn a_second_request_reuses_the_full_blocks_and_the_user_becomes_resident() {
        let (mut memory, model) = setup(32);
        let block = model.config().block_size;
        let mut prefixes = UserPrefixes::new(10, block);
        let history: Vec<u32> = (0..(2 * block + 3) as u32).collect();
        let toks = tokens(&model, history.len());
        let ((), reused) = with_prefix(
            &mut prefixes,
            &mut memory,
            &model,
            5,
            &history,
            &toks,
            |_, p| {
                assert_eq!(p.block_table.len(), 3);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(reused, 0);
        assert!(prefixes.is_resident(&memory, 5));
        assert_eq!(prefixes.take_touched(), BTreeSet::from([5]));
        let ((), reused) = with_prefix(
            &mut prefixes,
            &mut memory,
            &model,
            5,
            &history,
            &toks,
            |_, _| Ok(()),
        )
        .unwrap();
        assert_eq!(reused, 2 * block, "the partial tail block is not cached");
        assert_eq!(prefixes.len(), 1);
    }

    #[test]
    fn a_failed_request_gives_every_page_back_and_caches_nothing() {
        let (mut memory, model) = setup(32);
        let block = model.config().block_size;
        let mut prefixes = UserPrefixes::new(10, block);
        let history: Vec<u32> = (0..(2 * block) as u32).collect();
        let toks = tokens(&model, history.len());
        let free = memory.stats().free_pages;
        let failed = with_prefix(
            &mut prefixes,
            &mut memory,
            &model,
            1,
            &history,
            &toks,
            |_, _| Err::<(), _>(ServeError::Model("boom".into())),
        );
        assert!(matches!(failed, Err(ServeError::Model(_))));
        assert_eq!(memory.stats().free_pages, free);
        assert!(!prefixes.is_resident(&memory, 1));
        assert!(prefixes.take_touched().is_empty());

        // Cached, then failed on top of the cached blocks: they are unpinned
        // (evictable again) and no page leaks.
        with_prefix(
            &mut prefixes,
            &mut memory,
            &model,
            1,
            &history,
            &toks,
            |_, _| Ok(()),
        )
        .unwrap();
        let cached_free = memory.stats().free_pages;
        let failed = with_prefix(
            &mut prefixes,
            &mut memory,
            &model,
            1,
            &history,
            &toks,
            |_, _| Err::<(), _>(ServeError::Model("boom".into())),
        );
        assert!(failed.is_err());
        assert_eq!(memory.stats().free_pages, cached_free);
        assert_eq!(memory.stats().scratch_pages, 0);
    }

    #[test]
    fn a_history_larger_than_the_pool_fails_without_leaking() {
        let (mut memory, model) = setup(2);
        let block = model.config().block_size;
        let mut prefixes = UserPrefixes::new(10, block);
        let history: Vec<u32> = (0..(4 * block) as u32).collect();
        let toks = tokens(&model, history.len());
        let free = memory.stats().free_pages;
        let failed = with_prefix(
            &mut prefixes,
            &mut memory,
            &model,
            1,
            &history,
            &toks,
            |_, _| Ok(()),
        );
        assert!(matches!(failed, Err(ServeError::Memory(_))), "{failed:?}");
        assert_eq!(memory.stats().free_pages, free);
    }
}
