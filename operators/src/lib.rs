//! Domain logic of a serving node and router, free of I/O and timely types.
pub mod allocator;
pub mod busy;
pub mod cache;
pub mod cachebench;
pub mod eviction;
pub mod history;
pub mod host;
pub mod hotness;
pub mod link;
pub mod lru;
pub mod node;
pub mod pool;
pub mod predictor;
pub mod retrieval;
pub mod router;
pub mod shards;
pub mod windows;
