//! Model hyper-parameters and the named presets.

use serde::{Deserialize, Serialize};

use crate::error::KernelError;

/// Shape of the GR transformer and of its paged KV cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Hidden width; every token row (embedding, K, V) has this many floats.
    pub d_model: usize,
    pub n_layers: usize,
    /// Attention heads; must divide `d_model`.
    pub n_heads: usize,
    /// FFN inner width.
    pub d_ff: usize,
    /// Tokens per paged KV block.
    pub block_size: usize,
    /// T: embedding tables summed into one item token (the caller sums them).
    pub n_tables: usize,
    /// C: size of each of the 3 semantic-ID codebooks (generative retrieval).
    pub codebook_size: usize,
    /// Rows of the learned position table; positions must stay below it.
    pub max_positions: usize,
}

impl ModelConfig {
    /// Names accepted by [`ModelConfig::preset`].
    pub const PRESETS: [&'static str; 3] = ["small", "hstu-3l", "hstu-6l"];

    /// A named preset: `small` (fast default: 64-dim, 2 layers, 2 heads),
    /// `hstu-3l` / `hstu-6l` (HSTU's 512-dim, 3 or 6 layers).
    pub fn preset(name: &str) -> Option<Self> {
        let hstu = |n_layers| ModelConfig {
            d_model: 512,
            n_layers,
            n_heads: 8,
            d_ff: 2048,
            block_size: 16,
            n_tables: 8,
            codebook_size: 1024,
            max_positions: 4096,
        };
        match name {
            "small" => Some(ModelConfig {
                d_model: 64,
                n_layers: 2,
                n_heads: 2,
                d_ff: 256,
                block_size: 16,
                n_tables: 8,
                codebook_size: 256,
                max_positions: 1024,
            }),
            "hstu-3l" => Some(hstu(3)),
            "hstu-6l" => Some(hstu(6)),
            _ => None,
        }
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// f32 values of one token's KV over all layers (K and V).
    pub fn kv_token_floats(&self) -> usize {
        self.n_layers * 2 * self.d_model
    }

    /// f32 values of one KV block: `block_size` tokens × layers × {K, V} ×
    /// `d_model`. Layout inside a block: `[layer][K|V][slot][d_model]`.
    pub fn kv_block_floats(&self) -> usize {
        self.block_size * self.kv_token_floats()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size.max(1))
    }

    /// Offset inside a block of (layer, K=0/V=1, slot).
    pub(crate) fn kv_offset(&self, layer: usize, kv: usize, slot: usize) -> usize {
        ((layer * 2 + kv) * self.block_size + slot) * self.d_model
    }

    /// Rejects shapes the kernels cannot run.
    pub fn validate(&self) -> Result<(), KernelError> {
        let bad = |m: String| Err(KernelError::InvalidConfig(m));
        if self.d_model == 0 || self.n_layers == 0 || self.n_heads == 0 || self.d_ff == 0 {
            return bad("d_model, n_layers, n_heads and d_ff must be >= 1".into());
        }
        if !self.d_model.is_multiple_of(self.n_heads) {
            return bad(format!(
                "n_heads {} does not divide d_model {}",
                self.n_heads, self.d_model
            ));
        }
        if self.block_size == 0 || self.max_positions == 0 {
            return bad("block_size and max_positions must be >= 1".into());
        }
        if self.codebook_size == 0 || self.codebook_size > u16::MAX as usize + 1 {
            return bad(format!(
                "codebook_size {} must be in 1..=65536",
                self.codebook_size
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_block_floats_multiply_out() {
        for name in ModelConfig::PRESETS {
            let cfg = ModelConfig::preset(name).unwrap();
            cfg.validate().unwrap();
            assert_eq!(
                cfg.kv_block_floats(),
                cfg.block_size * cfg.n_layers * 2 * cfg.d_model
            );
        }
        let small = ModelConfig::preset("small").unwrap();
        assert_eq!(
            (
                small.d_model,
                small.n_layers,
                small.n_heads,
                small.d_ff,
                small.block_size
            ),
            (64, 2, 2, 256, 16)
        );
        assert!(ModelConfig::preset("nope").is_none());
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let mut v = serde_json::to_value(ModelConfig::preset("small").unwrap()).unwrap();
        v["extra"] = 1.into();
        assert!(serde_json::from_value::<ModelConfig>(v).is_err());
    }
}
