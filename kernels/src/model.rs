//! The GR transformer's weights: seeded init, safetensors round trip and the
//! model version string every response carries.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::backend::{Backend, CpuBackend, MatRef, Weight};
use crate::config::ModelConfig;
use crate::error::KernelError;

/// One pre-norm transformer layer. Matrices are row-major `in × out`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LayerWeights {
    pub ln1: Vec<f32>,
    /// Fused Q|K|V projection, `d × 3d`.
    pub wqkv: Vec<f32>,
    pub wo: Vec<f32>,
    pub ln2: Vec<f32>,
    pub w1: Vec<f32>,
    pub w2: Vec<f32>,
}

/// A layer's matrices stored once more column-major (`out × in` row-major),
/// indexed by [`LayerMatrix`]: the layout in which the CPU backend
/// multiplies rows by a large weight without repacking the weight on every
/// call (see `CpuBackend::matmul_weight`).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ColMajor([Vec<f32>; 4]);

/// Weights with fewer floats than this stay row-major only: small ones
/// multiply faster row-major (`d_model` 64: ~10% at 150 rows, ~30% at 32),
/// large ones column-major (`d_model` 512: up to 2x at 32 rows and below).
const COL_MAJOR_MIN_FLOATS: usize = 1 << 16;

/// One of a layer's four matrices.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LayerMatrix {
    Qkv,
    Out,
    Ff1,
    Ff2,
}

impl LayerMatrix {
    const ALL: [LayerMatrix; 4] = [Self::Qkv, Self::Out, Self::Ff1, Self::Ff2];

    /// `in × out`.
    fn shape(self, cfg: &ModelConfig) -> (usize, usize) {
        let (d, f) = (cfg.d_model, cfg.d_ff);
        match self {
            Self::Qkv => (d, 3 * d),
            Self::Out => (d, d),
            Self::Ff1 => (d, f),
            Self::Ff2 => (f, d),
        }
    }
}

impl LayerWeights {
    /// Matrix `which`, row-major.
    fn matrix(&self, which: LayerMatrix) -> &[f32] {
        match which {
            LayerMatrix::Qkv => &self.wqkv,
            LayerMatrix::Out => &self.wo,
            LayerMatrix::Ff1 => &self.w1,
            LayerMatrix::Ff2 => &self.w2,
        }
    }
}

/// A row-major `rows × cols` matrix transposed: the same matrix column-major.
fn col_major(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; w.len()];
    for (i, row) in w.chunks_exact(cols).enumerate() {
        for (j, v) in row.iter().enumerate() {
            t[j * rows + i] = *v;
        }
    }
    t
}

/// A decoder-only GR transformer (pre-norm RMSNorm, softmax attention,
/// GELU FFN, learned absolute positions) with two heads:
/// - ranking: a bilinear pointer head `s_i = softmax_i(⟨W_rank·h_Instr, k_i⟩/√d)`
///   over each candidate's last-layer key `k_i`, so that scores can be read
///   from cached item KV (Item-as-prefix) as well as from fresh items;
/// - generative retrieval: three codebook heads (`d × C`) and the embeddings
///   of the first two codes fed back as decode inputs.
pub struct GrModel {
    pub(crate) cfg: ModelConfig,
    pub(crate) layers: Vec<LayerWeights>,
    /// `layers` column-major, derived from them when the model is built.
    pub(crate) cols: Vec<ColMajor>,
    /// `sid_head` column-major per level (`3 × C × d`), derived likewise.
    pub(crate) sid_head_cols: Vec<f32>,
    /// `max_positions × d`.
    pub(crate) pos: Vec<f32>,
    /// The instruction (discriminant) token of ranking requests.
    pub(crate) instr: Vec<f32>,
    /// The first decode input of generative retrieval.
    pub(crate) gen_token: Vec<f32>,
    pub(crate) ln_f: Vec<f32>,
    /// `d × d` ranking projection.
    pub(crate) w_rank: Vec<f32>,
    /// Codes 0 and 1 as decode inputs: `2 × C × d`.
    pub(crate) sid_emb: Vec<f32>,
    /// Codebook heads for levels 0..3: `3 × d × C`.
    pub(crate) sid_head: Vec<f32>,
    version: String,
    pub(crate) backend: Arc<dyn Backend>,
}

impl fmt::Debug for GrModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrModel")
            .field("cfg", &self.cfg)
            .field("version", &self.version)
            .field("backend", &self.backend)
            .finish()
    }
}

struct Init(ChaCha8Rng);

impl Init {
    /// Uniform in [-a, a].
    fn uniform(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n)
            .map(|_| ((self.0.next_u32() >> 8) as f32 * (1.0 / 16_777_216.0) * 2.0 - 1.0) * a)
            .collect()
    }
    /// Uniform with standard deviation `std`.
    fn normalish(&mut self, n: usize, std: f32) -> Vec<f32> {
        self.uniform(n, std * 3f32.sqrt())
    }
}

impl GrModel {
    /// A model with deterministic weights drawn from ChaCha8 seeded by
    /// `seed`, on the single-threaded CPU backend. Panics if `cfg` fails
    /// [`ModelConfig::validate`] (configs are checked where they are read).
    pub fn new(cfg: ModelConfig, seed: u64) -> Self {
        Self::try_new(cfg, seed).expect("invalid ModelConfig")
    }

    /// As [`GrModel::new`], returning config errors.
    pub fn try_new(cfg: ModelConfig, seed: u64) -> Result<Self, KernelError> {
        cfg.validate()?;
        let mut init = Init(ChaCha8Rng::seed_from_u64(seed));
        let (d, f, c) = (cfg.d_model, cfg.d_ff, cfg.codebook_size);
        let wd = 1.0 / (d as f32).sqrt();
        let wf = 1.0 / (f as f32).sqrt();
        let layers = (0..cfg.n_layers)
            .map(|_| LayerWeights {
                ln1: vec![1.0; d],
                wqkv: init.normalish(d * 3 * d, wd),
                wo: init.normalish(d * d, wd * 0.5),
                ln2: vec![1.0; d],
                w1: init.normalish(d * f, wd),
                w2: init.normalish(f * d, wf * 0.5),
            })
            .collect();
        let model = GrModel {
            pos: init.normalish(cfg.max_positions * d, 0.5),
            instr: init.normalish(d, 1.0),
            gen_token: init.normalish(d, 1.0),
            ln_f: vec![1.0; d],
            w_rank: init.normalish(d * d, wd),
            sid_emb: init.normalish(2 * c * d, 1.0),
            // Wider than 1/√d so that code distributions are not flat.
            sid_head: init.normalish(3 * d * c, 3.0 * wd),
            layers,
            cols: Vec::new(),
            sid_head_cols: Vec::new(),
            cfg,
            version: String::new(),
            backend: Arc::new(CpuBackend::default()),
        };
        Ok(model.built())
    }

    /// The same weights on another backend (e.g. a multi-threaded CPU one).
    pub fn with_backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = backend;
        self
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// `gr-<d>d<L>l-<hash>`: a hash of config and every weight, so two
    /// models with the same version compute the same function.
    pub fn model_version(&self) -> String {
        self.version.clone()
    }

    /// Derives what is computed from the weights: the column-major copies
    /// (of large weights only) and the version. Every constructor ends here.
    fn built(mut self) -> Self {
        let (d, c) = (self.cfg.d_model, self.cfg.codebook_size);
        if d * d < COL_MAJOR_MIN_FLOATS {
            return self.with_version();
        }
        let cfg = &self.cfg;
        self.cols = self
            .layers
            .iter()
            .map(|l| {
                ColMajor(LayerMatrix::ALL.map(|which| {
                    let (rows, cols) = which.shape(cfg);
                    col_major(l.matrix(which), rows, cols)
                }))
            })
            .collect();
        self.sid_head_cols = self
            .sid_head
            .chunks_exact(d * c)
            .flat_map(|level| col_major(level, d, c))
            .collect();
        self.with_version()
    }

    /// Layer `l`'s matrix `which` (`in × out`), with its column-major copy
    /// where [`GrModel::built`] made one.
    pub(crate) fn layer_matrix(&self, l: usize, which: LayerMatrix) -> Weight<'_> {
        let (rows, cols) = which.shape(&self.cfg);
        Weight {
            row_major: MatRef::row_major(self.layers[l].matrix(which), rows, cols),
            col_major: self
                .cols
                .get(l)
                .map(|c| MatRef::col_major(&c.0[which as usize], rows, cols)),
        }
    }

    /// The codebook head of decode step `level` (`d × C`), like
    /// [`GrModel::layer_matrix`].
    pub(crate) fn sid_head_matrix(&self, level: usize) -> Weight<'_> {
        let (d, c) = (self.cfg.d_model, self.cfg.codebook_size);
        let at = level * d * c..(level + 1) * d * c;
        Weight {
            row_major: MatRef::row_major(&self.sid_head[at.clone()], d, c),
            col_major: (!self.sid_head_cols.is_empty())
                .then(|| MatRef::col_major(&self.sid_head_cols[at], d, c)),
        }
    }

    fn with_version(mut self) -> Self {
        let mut h = Fnv::default();
        h.bytes(
            serde_json::to_string(&self.cfg)
                .unwrap_or_default()
                .as_bytes(),
        );
        for (_, t) in self.tensors() {
            h.floats(t);
        }
        self.version = format!(
            "gr-{}d{}l-{:016x}",
            self.cfg.d_model, self.cfg.n_layers, h.0
        );
        self
    }

    /// Named tensors with their shapes, in a fixed order.
    fn tensors(&self) -> Vec<(String, &[f32])> {
        let mut out: Vec<(String, &[f32])> = vec![
            ("pos_emb".into(), &self.pos),
            ("instr_token".into(), &self.instr),
            ("gen_token".into(), &self.gen_token),
            ("ln_f".into(), &self.ln_f),
            ("w_rank".into(), &self.w_rank),
            ("sid_emb".into(), &self.sid_emb),
            ("sid_head".into(), &self.sid_head),
        ];
        for (i, l) in self.layers.iter().enumerate() {
            for (name, t) in [
                ("ln1", &l.ln1),
                ("wqkv", &l.wqkv),
                ("wo", &l.wo),
                ("ln2", &l.ln2),
                ("w1", &l.w1),
                ("w2", &l.w2),
            ] {
                out.push((format!("layers.{i}.{name}"), t));
            }
        }
        out
    }

    fn shape_of(cfg: &ModelConfig, name: &str) -> Vec<usize> {
        let (d, f, c) = (cfg.d_model, cfg.d_ff, cfg.codebook_size);
        match name.rsplit('.').next().unwrap_or(name) {
            "pos_emb" => vec![cfg.max_positions, d],
            "instr_token" | "gen_token" | "ln_f" | "ln1" | "ln2" => vec![d],
            "w_rank" | "wo" => vec![d, d],
            "sid_emb" => vec![2, c, d],
            "sid_head" => vec![3, d, c],
            "wqkv" => vec![d, 3 * d],
            "w1" => vec![d, f],
            "w2" => vec![f, d],
            _ => vec![],
        }
    }

    /// The weights as a safetensors buffer (f32, little-endian); the config
    /// rides in the metadata under `grflow.model_config`.
    pub fn to_safetensors(&self) -> Vec<u8> {
        let tensors = self.tensors();
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|(name, t)| {
                (
                    name.clone(),
                    Self::shape_of(&self.cfg, name),
                    t.iter().flat_map(|v| v.to_le_bytes()).collect(),
                )
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(name, shape, b)| {
                (
                    name.clone(),
                    TensorView::new(Dtype::F32, shape.clone(), b)
                        .expect("shape matches the weights"),
                )
            })
            .collect();
        let mut meta = HashMap::new();
        meta.insert(
            CONFIG_KEY.to_string(),
            serde_json::to_string(&self.cfg).expect("config serialises"),
        );
        safetensors::serialize(views, Some(meta)).expect("serialising in-memory tensors")
    }

    /// Reads a buffer written by [`GrModel::to_safetensors`]; every tensor
    /// is checked against the config's shapes. Uses the CPU backend.
    pub fn from_safetensors(bytes: &[u8]) -> Result<GrModel, KernelError> {
        let st_err = |e: safetensors::SafeTensorError| KernelError::Safetensors(e.to_string());
        let (_, meta) = SafeTensors::read_metadata(bytes).map_err(st_err)?;
        let cfg_json = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get(CONFIG_KEY))
            .ok_or_else(|| KernelError::Weights(format!("metadata key {CONFIG_KEY} missing")))?;
        let cfg: ModelConfig = serde_json::from_str(cfg_json)
            .map_err(|e| KernelError::Weights(format!("config: {e}")))?;
        cfg.validate()?;
        let st = SafeTensors::deserialize(bytes).map_err(st_err)?;
        let read = |name: &str| -> Result<Vec<f32>, KernelError> {
            let view = st
                .tensor(name)
                .map_err(|e| KernelError::Weights(format!("{name}: {e}")))?;
            if view.dtype() != Dtype::F32 {
                return Err(KernelError::Weights(format!(
                    "{name}: dtype {:?}, expected F32",
                    view.dtype()
                )));
            }
            let want = Self::shape_of(&cfg, name);
            if view.shape() != want.as_slice() {
                return Err(KernelError::Weights(format!(
                    "{name}: shape {:?}, expected {want:?}",
                    view.shape()
                )));
            }
            finite_f32s(name, view.data())
        };
        let layers = (0..cfg.n_layers)
            .map(|i| {
                Ok(LayerWeights {
                    ln1: read(&format!("layers.{i}.ln1"))?,
                    wqkv: read(&format!("layers.{i}.wqkv"))?,
                    wo: read(&format!("layers.{i}.wo"))?,
                    ln2: read(&format!("layers.{i}.ln2"))?,
                    w1: read(&format!("layers.{i}.w1"))?,
                    w2: read(&format!("layers.{i}.w2"))?,
                })
            })
            .collect::<Result<Vec<_>, KernelError>>()?;
        let model = GrModel {
            pos: read("pos_emb")?,
            instr: read("instr_token")?,
            gen_token: read("gen_token")?,
            ln_f: read("ln_f")?,
            w_rank: read("w_rank")?,
            sid_emb: read("sid_emb")?,
            sid_head: read("sid_head")?,
            layers,
            cols: Vec::new(),
            sid_head_cols: Vec::new(),
            cfg,
            version: String::new(),
            backend: Arc::new(CpuBackend::default()),
        };
        Ok(model.built())
    }

    /// Position embedding row `p`.
    pub(crate) fn pos_row(&self, p: usize) -> &[f32] {
        let d = self.cfg.d_model;
        &self.pos[p * d..(p + 1) * d]
    }

    pub(crate) fn check_pos(&self, end: usize) -> Result<(), KernelError> {
        if end > self.cfg.max_positions {
            return Err(KernelError::PositionOutOfRange {
                pos: end - 1,
                max: self.cfg.max_positions,
            });
        }
        Ok(())
    }
}

const CONFIG_KEY: &str = "grflow.model_config";

/// FNV-1a over bytes (the version hash; not cryptographic).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn floats(&mut self, t: &[f32]) {
        for v in t {
            self.0 = (self.0 ^ v.to_bits() as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The little-endian f32s of tensor `name`'s bytes. A NaN or infinite
/// weight scores every item NaN: refused on load, named.
pub(crate) fn finite_f32s(name: &str, data: &[u8]) -> Result<Vec<f32>, KernelError> {
    let values: Vec<f32> = data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    match values.iter().position(|x| !x.is_finite()) {
        None => Ok(values),
        Some(i) => Err(KernelError::Weights(format!(
            "{name}: element {i} is {}, not a finite number",
            values[i]
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_init_is_deterministic_and_round_trips() {
        let cfg = ModelConfig::preset("small").unwrap();
        let a = GrModel::new(cfg.clone(), 7);
        let b = GrModel::new(cfg.clone(), 7);
        let c = GrModel::new(cfg, 8);
        assert_eq!(a.model_version(), b.model_version());
        assert_ne!(a.model_version(), c.model_version());
        let bytes = a.to_safetensors();
        let back = GrModel::from_safetensors(&bytes).unwrap();
        assert_eq!(back.model_version(), a.model_version());
        assert_eq!(back.layers, a.layers);
        assert_eq!(back.sid_head, a.sid_head);
        assert!(GrModel::from_safetensors(&bytes[..bytes.len() / 2]).is_err());
    }

    #[test]
    fn a_non_finite_weight_is_refused_naming_its_tensor() {
        let cfg = ModelConfig::preset("small").unwrap();
        let mut m = GrModel::new(cfg, 7);
        m.w_rank[3] = f32::NAN;
        let err = GrModel::from_safetensors(&m.to_safetensors()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("w_rank: element 3 is NaN"), "{msg}");
    }
}
