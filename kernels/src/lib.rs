//! The GR model and its compute mechanisms behind a `Backend` trait.
pub mod kv_store;

pub use kv_store::{KvBlockStore, VecKvStore};
