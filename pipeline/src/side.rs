//! Side tables every worker holds in full: user histories and the item
//! catalog (small next to the request stream, which is sharded).

use grflow_operators::eviction::KeyMap;
use grflow_operators::node::ItemCatalog;
use grflow_operators::retrieval::RetrievalIndex;
use grflow_operators::router::shard_profile;
use grflow_operators::shards::{ShardId, ShardMap};
use grflow_traces::{Item, Request, TraceMeta, UserHistory};

#[derive(Debug)]
pub struct SideTables {
    pub meta: TraceMeta,
    // Integer-keyed lookups on every request and history item: the fast
    // hasher (nothing iterates these in an order that matters).
    users: KeyMap<u64, Vec<u32>>,
    items: KeyMap<u32, Item>,
    pub shards: ShardMap,
    /// Semantic IDs of the catalog for retrieve requests.
    pub retrieval: RetrievalIndex,
}

/// Why a request cannot be served from the side tables.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SideError {
    #[error("user_id {user}: hist_len {hist_len} exceeds the {have} interactions in users.parquet")]
    HistoryTooShort {
        user: u64,
        hist_len: u32,
        have: usize,
    },
    #[error("items.parquet: semantic IDs do not fit codebook_size {codebook_size}: {reason}")]
    SemanticIds { codebook_size: u16, reason: String },
}

impl SideTables {
    pub fn new(
        meta: TraceMeta,
        users: Vec<UserHistory>,
        items: Vec<Item>,
        shard_rows: u32,
    ) -> Result<Self, SideError> {
        let shards = ShardMap::new(&meta.table_rows, shard_rows);
        let retrieval = RetrievalIndex::new(
            items.iter().map(|i| (i.item_id, i.sid)),
            meta.codebook_size as usize,
        )
        .map_err(|e| SideError::SemanticIds {
            codebook_size: meta.codebook_size,
            reason: e.to_string(),
        })?;
        Ok(Self {
            meta,
            users: users.into_iter().map(|u| (u.user_id, u.items)).collect(),
            items: items.into_iter().map(|i| (i.item_id, i)).collect(),
            shards,
            retrieval,
        })
    }

    /// Whether the users table has a row for `user`.
    pub fn knows_user(&self, user: u64) -> bool {
        self.users.contains_key(&user)
    }

    /// Every user's full history, in no particular order (what the cluster
    /// handshake digests, `crate::job`).
    pub fn users(&self) -> impl Iterator<Item = (u64, &[u32])> + '_ {
        self.users
            .iter()
            .map(|(&user, items)| (user, items.as_slice()))
    }

    /// The first `hist_len` interactions of `user`. Unknown users are
    /// served with an empty history (new users are normal traffic).
    pub fn history(&self, user: u64, hist_len: u32) -> Result<&[u32], SideError> {
        let Some(all) = self.users.get(&user) else {
            return Ok(&[]);
        };
        all.get(..hist_len as usize)
            .ok_or(SideError::HistoryTooShort {
                user,
                hist_len,
                have: all.len(),
            })
    }

    /// Catalog entry of an item; `None` for items the catalog does not know.
    pub fn item(&self, item: u32) -> Option<&Item> {
        self.items.get(&item)
    }

    /// The catalog in item_id order (what trained weights are checked
    /// against).
    pub fn catalog(&self) -> Vec<Item> {
        let mut items: Vec<Item> = self.items.values().cloned().collect();
        items.sort_by_key(|i| i.item_id);
        items
    }

    pub fn num_items(&self) -> usize {
        self.items.len()
    }

    /// Embedding rows (table, feature id) an item reads.
    pub fn item_rows(&self, item: u32) -> impl Iterator<Item = (u16, u32)> + '_ {
        self.items.get(&item).into_iter().flat_map(|i| {
            i.feature_ids
                .iter()
                .enumerate()
                .map(|(t, &f)| (t as u16, f))
        })
    }

    /// `Prof[u]`: the K hot shards of the user's history prefix.
    pub fn shard_profile(&self, history: &[u32], k: usize) -> Vec<ShardId> {
        shard_profile(
            history
                .iter()
                .flat_map(|&item| self.item_rows(item))
                .map(|(t, f)| self.shards.shard_of(t, f)),
            k,
        )
    }

    /// Tokens a request brings before any reuse: history, candidates and the
    /// instruction token.
    pub fn request_tokens(&self, req: &Request, history: &[u32]) -> f64 {
        (history.len() + req.candidates.len() + 1) as f64
    }
}

impl ItemCatalog for SideTables {
    fn feature_ids(&self, item: u32) -> Option<&[u32]> {
        self.items.get(&item).map(|i| i.feature_ids.as_slice())
    }
}
