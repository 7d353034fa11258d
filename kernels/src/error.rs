//! Errors of the kernels: bad shapes, configs and weights, never panics on
//! caller input.

/// Everything a kernel call can reject.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    #[error("{what}: expected {expected} floats, got {got}")]
    Shape {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("position {pos} is beyond max_positions {max}")]
    PositionOutOfRange { pos: usize, max: usize },
    #[error("block table holds {got} blocks but {needed} are needed")]
    BlockTableTooShort { needed: usize, got: usize },
    #[error("KV store blocks hold {got} floats but the model needs {expected}")]
    BlockFloats { expected: usize, got: usize },
    #[error("empty input: {0}")]
    Empty(&'static str),
    #[error("safetensors: {0}")]
    Safetensors(String),
    #[error("weights: {0}")]
    Weights(String),
    #[error("beam search: {0}")]
    Beam(String),
    #[error("semantic id {sid:?} has a code >= codebook size {codebook_size}")]
    SidOutOfRange { sid: [u16; 3], codebook_size: usize },
}
