//! The GR model and its compute mechanisms behind a `Backend` trait.
//!
//! - [`GrModel`]: a decoder-only GR transformer with seeded init and
//!   safetensors (de)serialisation.
//! - Paged KV prefix reuse and BAT bipartite attention:
//!   [`GrModel::prefill`], [`GrModel::rank_user_prefix`],
//!   [`GrModel::item_kv`], [`GrModel::rank_item_prefix`].
//! - xGR generative retrieval: [`BeamSearch`] with shared/unshared KV,
//!   staged attention, early-terminating top-BW and a [`SidTrie`].
//! - [`reference`](mod@reference): naive full recomputation, the ground truth of the tests.
mod attention;
pub mod backend;
mod beam;
pub mod bench;
pub mod config;
pub mod cost;
pub mod error;
pub mod flops;
mod forward;
pub mod history;
pub mod kv_store;
mod model;
mod ops;
pub mod reference;
mod staged;
pub mod tables;
pub mod tally;
mod topk;
mod trie;

pub use backend::{Backend, CpuBackend, MatMut, MatRef, Weight};
pub use beam::{BeamHit, BeamKvBytes, BeamPrompt, BeamSearch, SID_STEPS, beam_kv_bytes};
pub use config::ModelConfig;
pub use error::KernelError;
pub use forward::{ItemKvRef, PrefillJob, RankJob, rank_softmax};
pub use kv_store::{KvBlockStore, VecKvStore, kv_row};
pub use model::GrModel;
pub use ops::sum_rows;
pub use staged::{
    SharedPrompt, StagedScratch, UnsharedKv, concat_attention, per_beam_attention, staged_attention,
};
pub use tables::EmbeddingTables;
pub use tally::{GemmTally, absorb as absorb_gemm, gemm_tally};
pub use topk::{Candidate, TopBw, rank_order, select_full_sort, select_nth_then_sort, sort_beam};
pub use trie::SidTrie;
