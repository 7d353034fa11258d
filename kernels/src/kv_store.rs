//! Where paged KV blocks live. The kernels read and write KV through this
//! trait so that the node's memory pool (operators/) can own the memory and
//! decide which page holds which block; kernels never allocate blocks.

/// Storage of fixed-size KV blocks addressed by page id.
pub trait KvBlockStore {
    /// f32 values in one block (see `ModelConfig::kv_block_floats`).
    fn block_floats(&self) -> usize;
    fn block(&self, id: u32) -> &[f32];
    fn block_mut(&mut self, id: u32) -> &mut [f32];
}

/// A plain arena of blocks, for tests and benches.
#[derive(Debug, Clone)]
pub struct VecKvStore {
    block_floats: usize,
    data: Vec<f32>,
}

impl VecKvStore {
    pub fn new(num_blocks: usize, block_floats: usize) -> Self {
        Self {
            block_floats,
            data: vec![0.0; num_blocks * block_floats],
        }
    }
    pub fn num_blocks(&self) -> usize {
        self.data.len() / self.block_floats.max(1)
    }
    /// Bytes of the arena actually allocated (its capacity).
    pub fn allocated_bytes(&self) -> usize {
        self.data.capacity() * std::mem::size_of::<f32>()
    }
}

impl KvBlockStore for VecKvStore {
    fn block_floats(&self) -> usize {
        self.block_floats
    }
    fn block(&self, id: u32) -> &[f32] {
        let s = id as usize * self.block_floats;
        &self.data[s..s + self.block_floats]
    }
    fn block_mut(&mut self, id: u32) -> &mut [f32] {
        let s = id as usize * self.block_floats;
        &mut self.data[s..s + self.block_floats]
    }
}

/// Token `token`'s K (`kv = 0`) or V (`kv = 1`) row of layer `layer` in a
/// sequence stored under `block_table` (block layout
/// `[layer][K|V][slot][d_model]`, see `ModelConfig::kv_block_floats`).
pub fn kv_row<'s, S: KvBlockStore + ?Sized>(
    cfg: &crate::ModelConfig,
    store: &'s S,
    block_table: &[u32],
    token: usize,
    layer: usize,
    kv: usize,
) -> &'s [f32] {
    let b = cfg.block_size;
    let off = cfg.kv_offset(layer, kv, token % b);
    &store.block(block_table[token / b])[off..off + cfg.d_model]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocated_bytes_is_the_arena_capacity() {
        let store = VecKvStore::new(3, 40);
        assert_eq!(store.num_blocks(), 3);
        assert!(store.allocated_bytes() >= 3 * 40 * 4);
        assert_eq!(store.allocated_bytes(), store.data.capacity() * 4);
    }
}
