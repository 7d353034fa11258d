//! The caches of a serving node, all in pool pages: the EMB cache, the
//! user-prefix KV cache (radix by chained block hash) and the item-prefix KV
//! cache, behind the [`NodeMemory`] façade that the node calls.

mod emb;
mod guided;
mod item;
mod node_memory;
mod prefix;

pub use emb::{EmbCache, TableCounters, emb_key};
pub use guided::GuidedPolicy;
pub use item::ItemKvCache;
pub use node_memory::{
    BoundaryMove, KvTenant, MemoryError, MemoryStats, NodeMemory, NodeMemoryConfig,
};
pub use prefix::{PrefixKvCache, PrefixMatch, block_hash};
