//! Prefix reuse: a request runs on its user's history KV, computed on top
//! of the longest prefix already cached. Afterwards the history's full
//! blocks join the prefix cache; on any failure every page the request
//! took is given back through one release path, and nothing is cached.

use std::collections::{BTreeSet, HashMap};

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
    /// The users of each head in `heads`: who loses residency when that
    /// block is evicted.
    users_by_head: HashMap<Vec<u32>, BTreeSet<u64>>,
    /// Users served since the last residency report.
    touched: BTreeSet<u64>,
    /// Users dropped from `heads` since the last residency report.
    dropped: BTreeSet<u64>,
    block_size: usize,
}

impl UserPrefixes {
    pub fn new(max_users: usize, block_size: usize) -> Self {
        Self {
            heads: LruMap::new(max_users),
            users_by_head: HashMap::new(),
            touched: BTreeSet::new(),
            dropped: BTreeSet::new(),
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
        self.track(user_id, history);
    }

    /// After `user_id`'s request on `history` was committed: its head is
    /// (still) the history's first block, and it was served.
    fn track(&mut self, user_id: u64, history: &[u32]) {
        let Some(head) = history.get(..self.block_size) else {
            return;
        };
        if self.heads.get(user_id).is_some_and(|kept| kept == head) {
            // Marks it most recently served; `make` is not called.
            self.heads.get_or_insert_with(user_id, Vec::new);
        } else {
            // New, or its first block changed (e.g. truncated).
            if let Some(old) = self.heads.remove(user_id) {
                self.unindex(user_id, &old);
            }
            if let Some((dropped, old)) = self.heads.insert(user_id, head.to_vec()) {
                self.unindex(dropped, &old);
                self.dropped.insert(dropped);
            }
            self.users_by_head
                .entry(head.to_vec())
                .or_default()
                .insert(user_id);
        }
        self.touched.insert(user_id);
    }

    fn unindex(&mut self, user: u64, head: &[u32]) {
        if let Some(users) = self.users_by_head.get_mut(head) {
            users.remove(&user);
            if users.is_empty() {
                self.users_by_head.remove(head);
            }
        }
    }

    /// The first block of `user`'s history as last served, while tracked.
    pub fn head(&self, user: u64) -> Option<&[u32]> {
        self.heads.get(user).map(Vec::as_slice)
    }

    /// Whether `user`'s prefix (at least its first block) is cached now.
    pub fn is_resident(&self, memory: &NodeMemory, user: u64) -> bool {
        self.head(user)
            .is_some_and(|head| memory.kv_cached_prefix_len(head) >= self.block_size)
    }

    /// Users served since the last call.
    pub fn take_touched(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.touched)
    }

    /// Users whose prefix may have left since the last call: those dropped
    /// from the table, and those whose head is among `evicted_heads` (root
    /// blocks the prefix cache evicted since the last call, see
    /// `PrefixKvCache::take_evicted_roots`). A user resident at the last
    /// call, in neither set and not served since is resident still: blocks
    /// leave the cache only by eviction.
    pub fn take_left<H: AsRef<[u32]>>(
        &mut self,
        evicted_heads: impl IntoIterator<Item = H>,
    ) -> BTreeSet<u64> {
        let mut left = std::mem::take(&mut self.dropped);
        for head in evicted_heads {
            if let Some(users) = self.users_by_head.get(head.as_ref()) {
                left.extend(users);
            }
        }
        left
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
    use crate::cache::{GuidedPolicy, NodeMemoryConfig, PrefixKvCache};
    use crate::link::LinkConfig;
    use crate::node::residency::Residency;
    use crate::pool::PagePool;
    use crate::router::NodeReport;
    use grflow_kernels::GrModel;
    use grflow_kernels::ModelConfig;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

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

    /// Residency over a bare prefix cache of `BT`-token blocks, reported
    /// two ways: incrementally (touched and left users) and by the full
    /// recheck of every user ever reported, as reports were made before.
    struct Tracked {
        cache: PrefixKvCache,
        pool: PagePool,
        prefixes: UserPrefixes,
        residency: Residency,
        reference: BTreeSet<u64>,
    }

    const BT: usize = 2;

    impl Tracked {
        fn new(pages: usize, max_users: usize) -> Self {
            let policy = GuidedPolicy::new("lru", pages).unwrap();
            let mut cache = PrefixKvCache::new(BT, policy);
            // Starts the record of evicted heads, as the first report would.
            assert!(cache.take_evicted_roots().is_empty());
            Self {
                cache,
                pool: PagePool::new(pages, 1),
                prefixes: UserPrefixes::new(max_users, BT),
                residency: Residency::default(),
                reference: BTreeSet::new(),
            }
        }

        /// A request of `user` on `history` as the node serves it: match,
        /// pages (evicting), commit. False when it did not fit.
        fn serve(&mut self, user: u64, history: &[u32]) -> bool {
            let (cache, pool) = (&mut self.cache, &mut self.pool);
            let m = cache.match_prefix(history);
            let need = history.len().div_ceil(BT) - m.blocks.len();
            while pool.free_pages() < need {
                if !cache.evict_one(pool) {
                    cache.release(pool, &m, &[]);
                    return false;
                }
            }
            let mut table = m.blocks.clone();
            table.extend((0..need).map(|_| pool.alloc_kv().unwrap()));
            cache.commit(pool, history, &table, &m);
            self.prefixes.track(user, history);
            true
        }

        fn resident(&self, user: u64) -> bool {
            self.prefixes
                .head(user)
                .is_some_and(|head| self.cache.cached_prefix_len(head) >= BT)
        }

        /// Both reports, asserted equal; returns it and the users it
        /// removed that were not served since the last one.
        fn report(&mut self) -> (NodeReport, usize) {
            let touched = self.prefixes.take_touched();
            let left = self.prefixes.take_left(self.cache.take_evicted_roots());
            let mut reference = NodeReport::default();
            for user in &touched | &self.reference {
                let (now, known) = (self.resident(user), self.reference.contains(&user));
                if now && !known {
                    self.reference.insert(user);
                    reference.kv_users_added.push(user);
                } else if !now && known {
                    self.reference.remove(&user);
                    reference.kv_users_removed.push(user);
                }
            }
            let mut report = NodeReport::default();
            let (prefixes, cache) = (&self.prefixes, &self.cache);
            let resident = |user| {
                prefixes
                    .head(user)
                    .is_some_and(|head| cache.cached_prefix_len(head) >= BT)
            };
            self.residency
                .report_users(touched.clone(), left, resident, &mut report);
            assert_eq!(report, reference);
            let untouched = report
                .kv_users_removed
                .iter()
                .filter(|u| !touched.contains(u))
                .count();
            (report, untouched)
        }
    }

    #[test]
    fn a_user_evicted_without_being_served_is_reported_removed() {
        let mut t = Tracked::new(8, 10);
        assert!(t.serve(1, &[1, 2, 3, 4, 5]));
        assert!(t.serve(2, &[1, 2, 9]));
        assert!(t.serve(3, &[7, 8]));
        assert_eq!(t.report().0.kv_users_added, vec![1, 2, 3]);
        // Users 1 and 2 share their head block. Leaves go first, least
        // recent first: 1's second block, the shared head, then 3's.
        for _ in 0..3 {
            assert!(t.cache.evict_one(&mut t.pool));
        }
        let (report, untouched) = t.report();
        assert_eq!(report.kv_users_removed, vec![1, 2, 3]);
        assert_eq!(untouched, 3);
        assert_eq!(t.report().0, NodeReport::default());
    }

    /// Random requests (shared heads, changed heads, more users than the
    /// table holds) and evictions: every report equals the full recheck.
    #[test]
    fn incremental_user_reports_equal_a_full_recheck() {
        let mut untouched_removals = 0;
        let mut dropped = 0;
        for seed in 0..16 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut t = Tracked::new(12, 6);
            for _ in 0..400 {
                match rng.random_range(0..10u32) {
                    0..7 => {
                        let user = rng.random_range(0..10u64);
                        // Four heads, shared between users, sometimes
                        // changed for the same user.
                        let head = (user + rng.random_range(0..2u64)) % 4;
                        let len = rng.random_range(1..8usize);
                        let mut history = vec![head as u32, 0];
                        history.extend((0..len).map(|_| rng.random_range(0..3u32)));
                        t.serve(user, &history);
                    }
                    7 => {
                        for _ in 0..rng.random_range(1..4) {
                            t.cache.evict_one(&mut t.pool);
                        }
                    }
                    _ => untouched_removals += t.report().1,
                }
            }
            dropped += t.prefixes.evictions();
        }
        assert!(untouched_removals > 20, "{untouched_removals}");
        assert!(dropped > 20, "{dropped}");
    }
}
