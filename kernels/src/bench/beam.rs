//! Beam-search figures: one wide search over a dense catalog (its time,
//! rows and KV bytes), and a group of serving-sized searches decoded
//! together against one of them alone.

use std::sync::Arc;

use super::{best_secs, rows, shuffled};
use crate::backend::Backend;
use crate::beam::{BeamKvBytes, BeamPrompt, BeamSearch, beam_kv_bytes};
use crate::config::ModelConfig;
use crate::error::KernelError;
use crate::kv_store::VecKvStore;
use crate::model::GrModel;
use crate::trie::SidTrie;

/// The largest codebook the benches accept: codes are u16.
pub const MAX_CODEBOOK: usize = 1 << 16;

/// The codes `0..c` of a codebook of `c <= MAX_CODEBOOK` (counted in u32,
/// so that `c = 65536` is not truncated to an empty range).
pub(super) fn codes(c: usize) -> impl Iterator<Item = u16> {
    debug_assert!(c <= MAX_CODEBOOK);
    (0..c.min(MAX_CODEBOOK) as u32).map(|x| x as u16)
}

/// A finished wide search on `small` with its prompt's KV: what the
/// top-k and attention figures start from.
pub(super) struct WideSearch {
    pub cfg: ModelConfig,
    pub store: VecKvStore,
    pub table: Vec<u32>,
    pub prompt: usize,
    /// Beam width = per-beam K.
    pub width: usize,
    pub search: BeamSearch,
    /// Best time of the whole search.
    pub secs: f64,
}

/// Generative retrieval on `small` with a dense catalog (32 × 32 × C
/// items), so that every beam has >= K valid codes at the last step.
pub(super) fn wide_search(
    backend: &Arc<dyn Backend>,
    width: usize,
    codebook: usize,
    prompt: usize,
    reps: usize,
) -> Result<WideSearch, KernelError> {
    let cfg = ModelConfig {
        codebook_size: codebook,
        ..ModelConfig::preset("small").expect("preset exists")
    };
    let model = GrModel::try_new(cfg.clone(), 8)?.with_backend(backend.clone());
    let mut store = VecKvStore::new(cfg.blocks_for(prompt), cfg.kv_block_floats());
    let table = shuffled(cfg.blocks_for(prompt), 9);
    model.prefill(&mut store, &table, 0, &rows(prompt, cfg.d_model, 10))?;
    let catalog: Vec<[u16; 3]> = (0..32u16)
        .flat_map(|a| (0..32u16).flat_map(move |b| codes(codebook).map(move |x| [a, b, x])))
        .collect();
    let trie = SidTrie::new(&catalog, codebook)?;
    let mut search = BeamSearch::new(&cfg, width, width, prompt)?;
    let mut result = Ok(());
    let secs = best_secs(reps, || {
        result = search
            .generate(&model, &store, &table, prompt, &trie)
            .map(|_| ())
    });
    result?;
    Ok(WideSearch {
        cfg,
        store,
        table,
        prompt,
        width,
        search,
        secs,
    })
}

/// The search's KV bytes as allocated, and the layouts it is compared with.
pub(super) struct KvBytes {
    pub prompt: usize,
    pub unshared: usize,
    /// The paged baseline and the ideal, from the search's actual forks.
    pub layouts: BeamKvBytes,
}

impl KvBytes {
    pub fn measured(&self) -> usize {
        self.prompt + self.unshared
    }
}

impl WideSearch {
    pub fn kv_bytes(&self) -> KvBytes {
        KvBytes {
            prompt: self.store.allocated_bytes(),
            unshared: self.search.unshared_kv_bytes(),
            layouts: beam_kv_bytes(
                &self.cfg,
                self.prompt,
                self.width,
                self.search.parents_per_step(),
            ),
        }
    }
}

/// Searches per group in the grouped beam measurement.
pub(super) const BEAM_GROUP: usize = 4;

/// One search alone and `BEAM_GROUP` searches decoded together at the
/// serving default (`hstu-3l`, BW = K = 32, 64-token prompt): ms of the
/// search alone, and ms of the group per search.
pub(super) fn group_ms(backend: &Arc<dyn Backend>, reps: usize) -> Result<(f64, f64), KernelError> {
    let cfg = ModelConfig::preset("hstu-3l").expect("hstu-3l preset");
    let (bw, prompt) = (32, 64);
    let model = GrModel::try_new(cfg.clone(), 12)?.with_backend(backend.clone());
    let mut store = VecKvStore::new(cfg.blocks_for(prompt), cfg.kv_block_floats());
    let table = shuffled(cfg.blocks_for(prompt), 13);
    model.prefill(&mut store, &table, 0, &rows(prompt, cfg.d_model, 14))?;
    let catalog: Vec<[u16; 3]> = (0..32u16)
        .flat_map(|a| (0..32u16).flat_map(move |b| (0..32u16).map(move |x| [a, b, x * 31])))
        .collect();
    let trie = SidTrie::new(&catalog, cfg.codebook_size)?;
    let prompts = [BeamPrompt {
        block_table: &table,
        prompt_len: prompt,
    }; BEAM_GROUP];
    let mut searches: Vec<BeamSearch> = (0..BEAM_GROUP)
        .map(|_| BeamSearch::new(&cfg, bw, bw, prompt))
        .collect::<Result<_, _>>()?;
    let mut result = Ok(());
    let alone = best_secs(reps, || {
        result = BeamSearch::generate_many(&mut searches[..1], &model, &store, &prompts[..1], &trie)
    });
    std::mem::replace(&mut result, Ok(()))?;
    let group = best_secs(reps, || {
        result = BeamSearch::generate_many(&mut searches, &model, &store, &prompts, &trie)
    });
    result?;
    Ok((alone * 1e3, group * 1e3 / BEAM_GROUP as f64))
}
